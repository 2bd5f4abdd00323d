//go:build linux && !amd64

package main

// trapTarget stands in for the amd64 one; the uprobe rows are not measured
// on this architecture (a Go function's first instruction is single-stepped).
//
//go:noinline
func trapTarget() {}

const trapProbes = false
