// Package stack ships the Gym-shaped Python test stack inside the gymtrace
// binary, so `gymtrace demo` runs anywhere Debian's python3-fastapi,
// python3-uvicorn and python3-aiohttp are installed.
package stack

import "embed"

// Files holds the stack: servers, launcher, collector and fake sandbox CLIs.
//
//go:embed *.py bin/ng_collect_rollouts bin/ng_run fakebin/docker fakebin/apptainer fakebin/enroot
var Files embed.FS
