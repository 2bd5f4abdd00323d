//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gymtrace/gymtrace/internal/agent"
	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/test/stack"
)

const demoPython = "/usr/bin/python3"

type demoServer struct {
	Name string `json:"name"`
	Type string `json:"type"`
	PID  int    `json:"pid"`
	URL  string `json:"url"`
}

type demoReady struct {
	Event   string                `json:"event"`
	Error   string                `json:"error"`
	Servers map[string]demoServer `json:"servers"`
	Argv    []string              `json:"collector_argv"`
}

// runDemo starts the embedded Gym-shaped stack (agent, model, resources as
// separate Python processes, already talking over pooled keep-alive
// connections), attaches to it as `gymtrace run --pid ...` would, runs a few
// rollouts through a collector, prints their traces and detaches.
func runDemo(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	if out, err := exec.Command(demoPython, "-c", "import fastapi, uvicorn, aiohttp").CombinedOutput(); err != nil {
		return fmt.Errorf("the demo runs its Gym-shaped stack on %s with FastAPI, uvicorn and aiohttp: %s(install them as root: ./scripts/setup, or apt-get install python3-fastapi python3-uvicorn python3-aiohttp python3-itsdangerous)", demoPython, strings.TrimSpace(string(out))+" ")
	}
	dir, err := os.MkdirTemp("", "gymtrace-demo-")
	if err != nil {
		return fmt.Errorf("making a directory for the demo stack: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := writeStack(dir); err != nil {
		return err
	}

	fmt.Println("gymtrace demo: starting a Gym-shaped stack (agent, model, resources; FastAPI + uvicorn + aiohttp)")
	launch := exec.Command(demoPython, filepath.Join(dir, "launch.py"), "--serve", "--warmup", "2", "--log-dir", filepath.Join(dir, "logs"))
	launch.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	launch.Stderr = io.Discard
	stdout, err := launch.StdoutPipe()
	if err != nil {
		return err
	}
	if err := launch.Start(); err != nil {
		return fmt.Errorf("starting the demo stack: %w", err)
	}
	defer func() {
		_ = syscall.Kill(-launch.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = launch.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-launch.Process.Pid, syscall.SIGKILL)
		}
	}()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	if !sc.Scan() {
		return errors.New("the demo stack exited before it was ready (logs: run test/stack/launch.py by hand)")
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	var ready demoReady
	if err := json.Unmarshal(sc.Bytes(), &ready); err != nil || ready.Event != "ready" {
		return fmt.Errorf("the demo stack did not start: %s", strings.TrimSpace(sc.Text()))
	}

	// Trace exactly the stack's servers, with the roles Gym gives them.
	dcfg := *cfg
	dcfg.Discover = false
	dcfg.PIDs = nil
	for _, kind := range []string{"agent", "model", "resources"} {
		s, ok := ready.Servers[kind]
		if !ok {
			return fmt.Errorf("the demo stack did not report its %s server", kind)
		}
		role, err := groups.ParseRole(s.Type)
		if err != nil {
			return err
		}
		dcfg.PIDs = append(dcfg.PIDs, config.PIDRole{PID: s.PID, Role: uint8(role)})
		fmt.Printf("  %-9s pid %-7d %s  %s\n", kind, s.PID, s.Name, s.URL)
	}

	tctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	attached := make(chan struct{})
	go func() {
		errc <- agent.Run(tctx, &dcfg, agent.Options{Log: log, Term: os.Stdout, Reloads: reloadsFor(log),
			Attached: func() { close(attached) }})
	}()
	select {
	case <-attached:
	case err := <-errc:
		return err
	case <-ctx.Done():
		return nil
	}

	fmt.Printf("gymtrace demo: span groups %s; running 3 rollouts, one at a time, then 4 concurrently\n\n",
		strings.Join(dcfg.Mask.Names(), ","))
	for _, run := range [][]string{{"--rollouts", "3", "--concurrency", "1"}, {"--rollouts", "4", "--concurrency", "4"}} {
		argv := append(append([]string{}, ready.Argv...), run...)
		col := exec.CommandContext(ctx, argv[0], argv[1:]...)
		if out, err := col.CombinedOutput(); err != nil {
			stop()
			<-errc
			return fmt.Errorf("the demo collector failed: %v: %s", err, strings.TrimSpace(string(out)))
		}
	}
	// Let the last exchanges reach the ring buffer and the tree printer.
	select {
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
	}
	stop()
	return <-errc
}

func writeStack(dir string) error {
	return fs.WalkDir(stack.Files, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, path)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := stack.Files.ReadFile(path)
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(path, "bin/") || strings.HasPrefix(path, "fakebin/") {
			mode = 0o755
		}
		if err := os.WriteFile(dst, b, mode); err != nil {
			return fmt.Errorf("writing the demo stack: %w", err)
		}
		return nil
	})
}
