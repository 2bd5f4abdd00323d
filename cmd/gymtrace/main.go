// Command gymtrace traces NeMo Gym's Python servers from the kernel, with no
// code in the traced processes, and emits the spans Gym's own telemetry would:
// same names, same span groups, one trace per rollout across processes.
package main

import (
	"context"
	"os"
)

func main() {
	os.Exit(runCLI(context.Background(), os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv))
}
