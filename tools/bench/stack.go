//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// stack is the Gym-shaped test stack, started once and kept warm.
type stack struct {
	launcher  *child
	pids      map[string]int    // agent, model, resources
	urls      map[string]string // their base URLs
	collector []string
	truth     string
	truthOff  int64
	// chroot: the Python root the stack runs in, "" for the host's; its
	// files are written inside it (inside) and read from here (host).
	chroot, inside, host string
	gymTel               bool // the servers run Gym's own telemetry (flush endpoint)
}

type readyLine struct {
	Event   string `json:"event"`
	Error   string `json:"error"`
	Servers map[string]struct {
		PID int    `json:"pid"`
		URL string `json:"url"`
	} `json:"servers"`
	CollectorArgv []string `json:"collector_argv"`
}

// startStack starts the stack of runtime; extra goes to launch.py (Gym
// telemetry options).
func startStack(ctx context.Context, root, dir string, warmup int, runtime string, extra []string) (*stack, error) {
	truth := filepath.Join(dir, "truth.jsonl")
	var args []string
	var chroot, inDir, hostDir string
	if r, ok := pyRoots[runtime]; ok {
		// The chrooted servers see the stack and the truth file inside the
		// root: both go there, and the truth is read back from the host.
		croot := r.dir()
		host, err := os.MkdirTemp(filepath.Join(croot, "tmp"), "gymtrace-bench-")
		if err != nil {
			return nil, err
		}
		if out, err := exec.Command("cp", "-r", filepath.Join(root, "test/stack"), filepath.Join(host, "stack")).CombinedOutput(); err != nil {
			os.RemoveAll(host)
			return nil, fmt.Errorf("copying test/stack into %s: %v %s", host, err, out)
		}
		inside := "/" + strings.TrimPrefix(host, croot+"/")
		chroot, inDir, hostDir = croot, inside, host
		truth = filepath.Join(host, "truth.jsonl")
		args = []string{"--python", "chroot " + croot + " " + r.python, "--stack-dir", inside + "/stack",
			"--loop", r.loop, "--http", r.http, "--truth", inside + "/truth.jsonl"}
	} else {
		args = []string{"--truth", truth}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	argv := append([]string{"/usr/bin/python3", filepath.Join(root, "test/stack/launch.py"), "--serve",
		"--warmup", strconv.Itoa(warmup), "--log-dir", filepath.Join(dir, "stack")}, append(args, extra...)...)
	c, err := startChild("test stack", argv, nil, filepath.Join(dir, "launch.log"), pw)
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, err
	}
	first := make(chan string, 1)
	go func() {
		br := bufio.NewReader(pr)
		l, _ := br.ReadString('\n')
		first <- l
		io.Copy(io.Discard, br)
		pr.Close()
	}()
	var line string
	select {
	case line = <-first:
	case <-time.After(120 * time.Second):
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("the test stack printed no ready line within 120s:\n%s", c.logTail())
	}
	var rl readyLine
	if err := json.Unmarshal([]byte(line), &rl); err != nil || rl.Event != "ready" {
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("the test stack did not start (%q %s):\n%s", strings.TrimSpace(line), rl.Error, c.logTail())
	}
	s := &stack{launcher: c, pids: map[string]int{}, urls: map[string]string{}, collector: rl.CollectorArgv, truth: truth,
		chroot: chroot, inside: inDir, host: hostDir, gymTel: slices.Contains(extra, "--gym-telemetry")}
	for _, role := range []string{"agent", "model", "resources"} {
		p := rl.Servers[role].PID
		if p == 0 {
			c.stop(5 * time.Second)
			return nil, fmt.Errorf("the test stack's ready line has no %s pid: %s", role, line)
		}
		s.pids[role] = p
		s.urls[role] = rl.Servers[role].URL
	}
	time.Sleep(400 * time.Millisecond) // let the warmup's truth records flush
	s.countRequests()
	return s, nil
}

// gymTelCounts is what the Gym-telemetry servers made and exported
// (test/stack/gymtel.py's flush endpoint), summed over the three.
type gymTelCounts struct {
	SpansEnded          float64 `json:"spans_ended"`
	SpansExported       float64 `json:"spans_exported"`
	SpansFailed         float64 `json:"spans_failed"`
	SpansDropped        float64 `json:"spans_dropped"`
	MetricExportsFailed float64 `json:"metric_exports_failed"`
	Flushed             bool    `json:"flushed"`
}

// flushGymTel has every server export what its batch processor holds, and
// returns the counts once they have.
func (s *stack) flushGymTel(ctx context.Context) (gymTelCounts, error) {
	var sum gymTelCounts
	sum.Flushed = true
	cl := &http.Client{Timeout: 30 * time.Second}
	for _, role := range []string{"agent", "model", "resources"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.urls[role]+"/_gymtel/flush", nil)
		if err != nil {
			return sum, err
		}
		resp, err := cl.Do(req)
		if err != nil {
			return sum, fmt.Errorf("flushing the %s server's Gym telemetry: %w", role, err)
		}
		var c gymTelCounts
		err = json.NewDecoder(resp.Body).Decode(&c)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return sum, fmt.Errorf("flushing the %s server's Gym telemetry: status %d, %v", role, resp.StatusCode, err)
		}
		sum.SpansEnded += c.SpansEnded
		sum.SpansExported += c.SpansExported
		sum.SpansFailed += c.SpansFailed
		sum.SpansDropped += c.SpansDropped
		sum.MetricExportsFailed += c.MetricExportsFailed
		sum.Flushed = sum.Flushed && c.Flushed
	}
	return sum, nil
}

func (s *stack) pidArg() string {
	return fmt.Sprintf("%d=agent,%d=model,%d=resources", s.pids["agent"], s.pids["model"], s.pids["resources"])
}

// cpu sums the servers' CPU so far (utime+stime of every thread).
func (s *stack) cpu() (time.Duration, error) {
	ns, err := s.sumServers(func(pid int) (uint64, error) {
		u, err := readProcUsage(pid)
		return uint64(u.CPU), err
	})
	return time.Duration(ns), err
}

// preemptions sums the servers' involuntary switches so far (readPreemptions).
func (s *stack) preemptions() (uint64, error) { return s.sumServers(readPreemptions) }

// sumServers adds read(pid) over the stack's servers.
func (s *stack) sumServers(read func(pid int) (uint64, error)) (uint64, error) {
	var sum uint64
	for role, p := range s.pids {
		n, err := read(p)
		if err != nil {
			return 0, fmt.Errorf("the %s server: %w", role, err)
		}
		sum += n
	}
	return sum, nil
}

// countRequests counts the "in" truth records (one per request a server
// finished) written since the last call.
func (s *stack) countRequests() int {
	f, err := os.Open(s.truth)
	if err != nil {
		return 0
	}
	defer f.Close()
	f.Seek(s.truthOff, io.SeekStart)
	data, _ := io.ReadAll(f)
	// Only whole lines: a flush in progress is counted next time.
	end := bytes.LastIndexByte(data, '\n') + 1
	s.truthOff += int64(end)
	n := 0
	for _, line := range bytes.Split(data[:end], []byte("\n")) {
		var r struct {
			Ev string `json:"ev"`
		}
		if json.Unmarshal(line, &r) == nil && r.Ev == "in" {
			n++
		}
	}
	return n
}

func (s *stack) stop() error {
	err := s.launcher.stop(20 * time.Second)
	if s.host != "" {
		os.RemoveAll(s.host)
	}
	return err
}

type collectorSummary struct {
	Rollouts     int     `json:"rollouts"`
	OK           int     `json:"ok"`
	ElapsedS     float64 `json:"elapsed_s"`
	RolloutsPerS float64 `json:"rollouts_per_s"`
	Errors       []any   `json:"errors"`
}

// collect runs the collector once and returns its summary and the /run
// latency of every rollout (seconds).
func (s *stack) collect(ctx context.Context, dir string, rollouts, conc int) (collectorSummary, []float64, error) {
	return s.collectLoad(ctx, dir, conc, "--rollouts", strconv.Itoa(rollouts))
}

// collectFor runs the collector for d of sending (then the rollouts in
// flight finish): two stacks loaded for the same seconds (the twin phase).
func (s *stack) collectFor(ctx context.Context, dir string, d time.Duration, conc int) (collectorSummary, error) {
	sum, _, err := s.collectLoad(ctx, dir, conc, "--rollouts", "0", "--duration", strconv.FormatFloat(d.Seconds(), 'f', 3, 64))
	return sum, err
}

// collectLoad runs the collector once with load (--rollouts N, or
// --duration S) at concurrency conc.
func (s *stack) collectLoad(ctx context.Context, dir string, conc int, load ...string) (collectorSummary, []float64, error) {
	var sum collectorSummary
	results, arg := filepath.Join(dir, "results.jsonl"), ""
	if s.chroot != "" {
		results, arg = filepath.Join(s.host, "results.jsonl"), filepath.Join(s.inside, "results.jsonl")
	} else {
		arg = results
	}
	os.Remove(results)
	argv := append(append(append([]string{}, s.collector...), load...),
		"--concurrency", strconv.Itoa(conc), "--results", arg)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, argv[0], argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	runErr := cmd.Run()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
		return sum, nil, fmt.Errorf("the collector printed no summary (%v): %s", runErr, tail(errb.String(), 800))
	}
	var lat []float64
	data, err := os.ReadFile(results)
	if err != nil {
		return sum, nil, fmt.Errorf("reading the collector's per-rollout results: %w", err)
	}
	for _, l := range bytes.Split(data, []byte("\n")) {
		var r struct {
			Status    *int    `json:"status"`
			DurationS float64 `json:"duration_s"`
		}
		if json.Unmarshal(l, &r) == nil && r.Status != nil && *r.Status == 200 {
			lat = append(lat, r.DurationS)
		}
	}
	return sum, lat, nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
