// Command sandboxcli is a fake sandbox provider CLI for gymtrace's tests. Build
// it under the name of the provider it stands for (docker, apptainer, enroot):
// gymtrace's kernel side recognises a provider by the executed file's name. A
// compiled fake is one process from exec to exit, with no interpreter exec and
// no child shells, so its span is exactly its own lifetime.
//
// It starts no container. It sleeps FAKE_SANDBOX_SLEEP_MS milliseconds (30 by
// default), then exits with the status the command asks for:
//
//	docker exec NAME sh -c 'exit 3'      -> exits 3
//	docker exec NAME sh -c 'kill -9 $$'  -> dies by SIGKILL (a signal, not a status)
//	anything else                        -> FAKE_SANDBOX_RC (0 by default)
//
// `docker run -d` prints a container id, as the real one does.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	sleep := 30 * time.Millisecond
	if v := os.Getenv("FAKE_SANDBOX_SLEEP_MS"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 0 {
			fmt.Fprintf(os.Stderr, "fake %s: FAKE_SANDBOX_SLEEP_MS=%q is not a number of milliseconds\n", name, v)
			os.Exit(2)
		}
		sleep = time.Duration(ms) * time.Millisecond
	}
	time.Sleep(sleep)

	rc := 0
	if v := os.Getenv("FAKE_SANDBOX_RC"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fake %s: FAKE_SANDBOX_RC=%q is not an exit status\n", name, v)
			os.Exit(2)
		}
		rc = n
	}
	if cmd, ok := shellCommand(args); ok {
		f := strings.Fields(cmd)
		switch {
		case len(f) == 2 && f[0] == "exit":
			n, err := strconv.Atoi(f[1])
			if err != nil || n < 0 || n > 255 {
				fmt.Fprintf(os.Stderr, "fake %s: cannot run %q: exit takes a status 0..255\n", name, cmd)
				os.Exit(2)
			}
			rc = n
		case len(f) == 3 && f[0] == "kill" && strings.HasPrefix(f[1], "-") && f[2] == "$$":
			sig, err := strconv.Atoi(f[1][1:])
			if err != nil || sig <= 0 || sig >= 32 {
				fmt.Fprintf(os.Stderr, "fake %s: cannot run %q: give a signal number\n", name, cmd)
				os.Exit(2)
			}
			// Go re-raises the terminating signals it handles with the
			// default disposition, so the process dies by the signal.
			syscall.Kill(os.Getpid(), syscall.Signal(sig))
			time.Sleep(time.Second)
			os.Exit(125)
		}
	}
	if len(args) > 0 && args[0] == "run" {
		fmt.Printf("fake%s%d\n", name, os.Getpid())
	}
	os.Exit(rc)
}

// shellCommand finds C in "... sh -c C".
func shellCommand(args []string) (string, bool) {
	for i := 0; i+2 < len(args); i++ {
		if args[i] == "sh" && args[i+1] == "-c" {
			return args[i+2], true
		}
	}
	return "", false
}
