//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gymtrace/gymtrace/test/freeport"
)

// child is a process the harness started. Every child is stopped by its own
// pid, never by name.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  string
}

// pinned prefixes argv with taskset when cpus is set, so the process and all
// its threads run on those CPUs (taskset execs: the pid stays the same).
func pinned(cpus string, argv []string) []string {
	if cpus == "" {
		return argv
	}
	return append([]string{"taskset", "-c", cpus}, argv...)
}

// startChild starts argv with stderr (and stdout, unless the caller reads it)
// going to logPath. The process gets SIGKILL if the harness dies.
func startChild(name string, argv []string, env []string, logPath string, stdout io.Writer) (*child, error) {
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating log %s: %w", logPath, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = lf
	cmd.Stdout = lf
	if stdout != nil {
		cmd.Stdout = stdout
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, argv[0], err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		c.err = cmd.Wait()
		lf.Close()
		close(c.done)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILL.
func (c *child) stop(grace time.Duration) error {
	if c.exited() {
		return c.err
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return c.err
	case <-time.After(grace):
		c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s (pid %d) did not stop within %s of SIGTERM and was killed", c.name, c.pid(), grace)
	}
}

// logTail is the end of the child's log, for error messages.
func (c *child) logTail() string {
	b, _ := os.ReadFile(c.log)
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return strings.TrimSpace(string(b))
}

// waitForLog polls the child's log for a line containing want.
func (c *child) waitForLog(ctx context.Context, want string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(c.log); strings.Contains(string(b), want) {
			return nil
		}
		if c.exited() {
			return fmt.Errorf("%s exited before logging %q: %v\n%s", c.name, want, c.err, c.logTail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not log %q within %s:\n%s", c.name, want, timeout, c.logTail())
}

// startListening starts a child that prints "listening HOST:PORT" as its
// first stdout line, and returns that address.
func startListening(name string, argv []string, logPath string) (*child, string, error) {
	c, lines, err := startListeningN(name, argv, logPath, 1)
	if err != nil {
		return nil, "", err
	}
	return c, lines[0], nil
}

// startListeningN is startListening for a child that prints n lines first
// (the otlpsink with --http-listen: "listening-http HOST:PORT" second); the
// first line's address comes back as lines[0], the others whole.
func startListeningN(name string, argv []string, logPath string, n int) (*child, []string, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	c, err := startChild(name, argv, nil, logPath, pw)
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, nil, err
	}
	lines := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		var got []string
		for len(got) < n && sc.Scan() {
			got = append(got, sc.Text())
		}
		lines <- got
		io.Copy(io.Discard, pr)
		pr.Close()
	}()
	select {
	case got := <-lines:
		if len(got) < n {
			c.stop(2 * time.Second)
			return nil, nil, fmt.Errorf("%s printed %d of its %d first lines (%q):\n%s", name, len(got), n, got, c.logTail())
		}
		addr, found := strings.CutPrefix(got[0], "listening ")
		if !found {
			c.stop(2 * time.Second)
			return nil, nil, fmt.Errorf("%s did not print \"listening HOST:PORT\" (got %q):\n%s", name, got[0], c.logTail())
		}
		got[0] = addr
		return c, got, nil
	case <-time.After(30 * time.Second):
		c.stop(2 * time.Second)
		return nil, nil, fmt.Errorf("%s printed nothing within 30s:\n%s", name, c.logTail())
	}
}

// gymtrace is one running gymtrace under test.
type gymtrace struct {
	*child
	metricsAddr string
}

// gymtraceOptions are what a run varies.
type gymtraceOptions struct {
	Bin     string
	Args    []string // --pid, --span-groups, exporter flags
	NoGate  bool     // GYMTRACE_BENCH_NO_GATE=1
	Env     []string // more KEY=VALUE for gymtrace (cost-experiment hooks)
	CPUs    string   // taskset list, "" for any
	LogPath string
}

// startGymtrace starts gymtrace with a metrics endpoint and waits for its
// "gymtrace: attached" line.
func startGymtrace(ctx context.Context, o gymtraceOptions) (*gymtrace, error) {
	port, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	argv := append([]string{o.Bin}, o.Args...)
	argv = append(argv, "--metrics-addr", addr, "--discover=false")
	env := slices.Clone(o.Env)
	if o.NoGate {
		env = append(env, "GYMTRACE_BENCH_NO_GATE=1")
	}
	c, err := startChild("gymtrace", pinned(o.CPUs, argv), env, o.LogPath, nil)
	if err != nil {
		return nil, err
	}
	if err := c.waitForLog(ctx, "gymtrace: attached", 60*time.Second); err != nil {
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("starting gymtrace (%s): %w", strings.Join(argv, " "), err)
	}
	return &gymtrace{child: c, metricsAddr: addr}, nil
}

// Metrics is one scrape of gymtrace's /metrics: "name" or "name{k=v}" -> value.
type Metrics map[string]float64

// Sum adds every series of a metric name (all label values).
func (m Metrics) Sum(name string) float64 {
	var s float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			s += v
		}
	}
	return s
}

func scrapeMetrics(addr string) (Metrics, error) {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scraping gymtrace metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping gymtrace metrics: HTTP %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

func parseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing gymtrace metrics: %w", err)
	}
	out := Metrics{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			key := name
			if ls := m.GetLabel(); len(ls) > 0 {
				var parts []string
				for _, l := range ls {
					parts = append(parts, l.GetName()+"="+l.GetValue())
				}
				key += "{" + strings.Join(parts, ",") + "}"
			}
			var v float64
			switch {
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			case m.GetUntyped() != nil:
				v = m.GetUntyped().GetValue()
			default:
				continue
			}
			out[key] = v
		}
	}
	return out, nil
}

// kernelSnap is what a gymtrace instance has done in the kernel so far.
type kernelSnap struct {
	Progs     map[uint32]BPFObject
	RingPos   uint64 // bytes reserved in the ring buffer so far
	GateFlags uint32
	Usage     ProcUsage
}

// snapKernel reads gymtrace's programs' bpf_stats, its ring buffer's
// producer position, gate flags and CPU/RSS.
func snapKernel(pid int) (kernelSnap, error) {
	var s kernelSnap
	progs, maps, err := bpfObjects(pid)
	if err != nil {
		return s, err
	}
	s.Progs = progs
	for id, m := range maps {
		switch {
		case m.MapType == 27: // BPF_MAP_TYPE_RINGBUF
			if pos, err := ringbufProducerPos(id); err == nil && pos > s.RingPos {
				s.RingPos = pos
			}
		case mapName(id) == "gt_config":
			if f, err := gateFlags(id); err == nil {
				s.GateFlags = f
			}
		}
	}
	s.Usage, err = readProcUsage(pid)
	return s, err
}

func workDir(base, name string) string {
	d := filepath.Join(base, name)
	os.MkdirAll(d, 0o755)
	return d
}

var errIncomplete = errors.New("the benchmark table is incomplete")
