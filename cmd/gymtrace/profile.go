package main

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// startCPUProfile writes the agent's CPU profile to path until the returned
// function runs (GYMTRACE_CPUPROFILE; read it with `go tool pprof`).
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("creating the profile file: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting the CPU profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
