//go:build linux

package main

// trapTarget does nothing; see trap_amd64.s.
//
//go:noescape
func trapTarget()

// trapProbes: this architecture has a trap target whose first instruction
// the kernel emulates.
const trapProbes = true
