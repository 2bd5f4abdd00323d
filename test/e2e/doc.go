//go:build linux

// Package e2e holds gymtrace's end-to-end tests: the real binary, attached by
// PID to the Gym-shaped Python stack (test/stack) and to small raw-socket HTTP
// servers and clients, exporting to a real OTLP receiver (test/otlpsink) or to
// jsonl. They load BPF programs, so they need root; without it, or without
// /usr/bin/python3's fastapi/uvicorn/aiohttp for the stack tests, every test
// skips and says why.
//
//	sudo go test ./test/e2e/ -v -count=1
package e2e
