//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// capRun is one capacity measurement: wrk drives the compiled server that
// gymtrace targets, gymtrace pinned to its own core.
type capRun struct {
	Exporter        string  `json:"exporter"`
	Rate            int     `json:"offered_rate"` // requests/s asked of wrk; 0 = as fast as it goes
	Rep             int     `json:"rep"`
	Seconds         float64 `json:"seconds"`
	Requests        float64 `json:"requests"`
	SpansBuilt      float64 `json:"spans_built"`
	SpansExported   float64 `json:"spans_exported"`
	SpansDropped    float64 `json:"spans_dropped"`
	RingbufFailed   float64 `json:"ringbuf_reserve_failures"`
	Records         float64 `json:"records"`
	TracerCPUMs     float64 `json:"tracer_cpu_ms"`
	TracerPeakRSS   uint64  `json:"tracer_peak_rss_bytes"`       // VmHWM: since start, start-up included
	TracerLoadRSS   uint64  `json:"tracer_rss_under_load_bytes"` // max VmRSS sampled while wrk ran
	SpansPerS       float64 `json:"spans_per_s"`
	CPUMsPer1000    float64 `json:"cpu_ms_per_1000_spans"`
	SpansPerCoreSec float64 `json:"spans_per_core_second"`
	CoresUsed       float64 `json:"cores_used"`
}

type capOptions struct {
	Gymtrace, Server, Sink, Dir string
	Seconds                     int
	Rates                       []int // offered requests/s, 0 = unthrottled
	Reps                        int
	Exporters                   []string // jsonl, otlp
	LoadCPUs, TracerCPUs        string
	Log                         *slog.Logger
}

func runCapacity(ctx context.Context, o capOptions) ([]capRun, error) {
	dir := workDir(o.Dir, "capacity")
	srv, addr, err := startListening("benchserver", pinned(o.LoadCPUs, []string{o.Server}), filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, err
	}
	defer srv.stop(5 * time.Second)
	var runs []capRun
	for rep := 0; rep < o.Reps; rep++ {
		for _, exp := range o.Exporters {
			for _, rate := range o.Rates {
				r, err := capOnce(ctx, o, dir, exp, rate, rep, srv.pid(), addr)
				if err != nil {
					return runs, fmt.Errorf("agent capacity, %s, rate %s, rep %d: %w", exp, rateName(rate), rep+1, err)
				}
				o.Log.Info("capacity run", "exporter", exp, "offered", rateName(rate), "spans_per_s", int(r.SpansPerS),
					"cores", fmt.Sprintf("%.2f", r.CoresUsed), "ringbuf_failures", r.RingbufFailed, "dropped", r.SpansDropped)
				runs = append(runs, r)
			}
		}
	}
	return runs, nil
}

// rateName labels an offered rate.
func rateName(rate int) string {
	if rate <= 0 {
		return "max"
	}
	return fmt.Sprintf("%d/s", rate)
}

// wrkLoad is how wrk offers a rate: wrk has no rate flag, but its Lua
// delay() hook holds each connection 1 ms between requests, so rate/1000
// connections offer at most rate requests/s (a little less: the response
// time adds to the 1 ms). Rate 0 is 32 connections flat out.
func wrkLoad(dir string, rate int) (conns int, script string, err error) {
	if rate <= 0 {
		return 32, "", nil
	}
	script = filepath.Join(dir, "delay1ms.lua")
	if err := os.WriteFile(script, []byte("function delay()\n  return 1\nend\n"), 0o644); err != nil {
		return 0, "", fmt.Errorf("writing the wrk script: %w", err)
	}
	return (rate + 999) / 1000, script, nil
}

func capOnce(ctx context.Context, o capOptions, dir, exporter string, rate, rep, target int, addr string) (capRun, error) {
	run := capRun{Exporter: exporter, Rate: rate, Rep: rep}
	conns, script, err := wrkLoad(dir, rate)
	if err != nil {
		return run, err
	}
	args := []string{"--pid", fmt.Sprintf("%d=resources", target), "--span-groups", "server"}
	switch exporter {
	case "jsonl":
		args = append(args, "--exporter", "jsonl", "--output", "/dev/null")
	case "otlp":
		sink, sinkAddr, err := startListening("otlpsink",
			pinned(o.LoadCPUs, []string{o.Sink, "--listen", "127.0.0.1:0", "--count-only"}),
			filepath.Join(dir, fmt.Sprintf("otlpsink-r%d-%d.log", rate, rep)))
		if err != nil {
			return run, err
		}
		defer sink.stop(5 * time.Second)
		args = append(args, "--exporter", "otlp", "--otlp-endpoint", "http://"+sinkAddr)
	default:
		return run, fmt.Errorf("unknown exporter %q", exporter)
	}
	gt, err := startGymtrace(ctx, gymtraceOptions{
		Bin: o.Gymtrace, Args: args, CPUs: o.TracerCPUs,
		LogPath: filepath.Join(dir, fmt.Sprintf("gymtrace-%s-r%d-%d.log", exporter, rate, rep)),
	})
	if err != nil {
		return run, err
	}
	defer gt.stop(15 * time.Second)

	url := "http://" + addr + "/seed_session"
	if _, err := runWrk(ctx, o.LoadCPUs, conns, script, 1, url); err != nil { // warm connections and the pipeline
		return run, err
	}
	if err := drain(gt.metricsAddr, 10*time.Second); err != nil {
		return run, err
	}
	k0, err := snapKernel(gt.pid())
	if err != nil {
		return run, err
	}
	m0, err := scrapeMetrics(gt.metricsAddr)
	if err != nil {
		return run, err
	}
	stopSampling := make(chan struct{})
	sampled := make(chan uint64, 1)
	go func() {
		var max uint64
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			if u, err := readProcUsage(gt.pid()); err == nil && u.RSSBytes > max {
				max = u.RSSBytes
			}
			select {
			case <-stopSampling:
				sampled <- max
				return
			case <-tick.C:
			}
		}
	}()
	w, err := runWrk(ctx, o.LoadCPUs, conns, script, o.Seconds, url)
	close(stopSampling)
	run.TracerLoadRSS = <-sampled
	if err != nil {
		return run, err
	}
	if err := drain(gt.metricsAddr, 30*time.Second); err != nil {
		return run, err
	}
	k1, err := snapKernel(gt.pid())
	if err != nil {
		return run, err
	}
	m1, err := scrapeMetrics(gt.metricsAddr)
	if err != nil {
		return run, err
	}
	d := func(name string) float64 { return m1.Sum(name) - m0.Sum(name) }
	run.Seconds = w.Seconds
	run.Requests = w.Requests
	run.SpansBuilt = d("gymtrace_spans_built_total")
	run.SpansExported = d("gymtrace_spans_exported_total")
	run.SpansDropped = d("gymtrace_spans_dropped_total") + d("gymtrace_spans_export_failed_total")
	run.RingbufFailed = d("gymtrace_ringbuf_reserve_failures_total")
	run.Records = d("gymtrace_ringbuf_records_read_total")
	run.TracerCPUMs = float64(k1.Usage.CPU-k0.Usage.CPU) / 1e6
	run.TracerPeakRSS = k1.Usage.HWMBytes
	if w.Seconds > 0 {
		run.SpansPerS = run.SpansBuilt / w.Seconds
		run.CoresUsed = run.TracerCPUMs / 1000 / w.Seconds
	}
	if run.SpansBuilt > 0 {
		run.CPUMsPer1000 = run.TracerCPUMs / run.SpansBuilt * 1000
	}
	if run.TracerCPUMs > 0 {
		run.SpansPerCoreSec = run.SpansBuilt / (run.TracerCPUMs / 1000)
	}
	return run, nil
}

// drain waits until gymtrace has built and exported everything it was given:
// spans built stops moving and the export queue is empty.
func drain(addr string, max time.Duration) error {
	deadline := time.Now().Add(max)
	last := -1.0
	for time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		m, err := scrapeMetrics(addr)
		if err != nil {
			return err
		}
		built := m.Sum("gymtrace_spans_built_total")
		if built == last && m.Sum("gymtrace_export_queue_length") == 0 {
			return nil
		}
		last = built
	}
	return nil // still moving: the figures say so (built < requests)
}

type wrkResult struct {
	Requests, Seconds, RPS float64
}

var (
	wrkDone = regexp.MustCompile(`(\d+) requests in ([\d.]+)(us|ms|s|m)`)
	wrkRPS  = regexp.MustCompile(`Requests/sec:\s+([\d.]+)`)
)

func runWrk(ctx context.Context, cpus string, conns int, script string, seconds int, url string) (wrkResult, error) {
	args := []string{"wrk", "-t1", "-c" + strconv.Itoa(conns), "-d" + strconv.Itoa(seconds) + "s"}
	if script != "" {
		args = append(args, "-s", script)
	}
	argv := pinned(cpus, append(args, url))
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return wrkResult{}, fmt.Errorf("wrk failed (apt-get install -y wrk if it is missing): %v: %s", err, tail(errb.String(), 300))
	}
	return parseWrk(out.String())
}

func parseWrk(s string) (wrkResult, error) {
	m := wrkDone.FindStringSubmatch(s)
	r := wrkRPS.FindStringSubmatch(s)
	if m == nil || r == nil {
		return wrkResult{}, fmt.Errorf("cannot read wrk's output: %q", tail(s, 300))
	}
	var w wrkResult
	w.Requests, _ = strconv.ParseFloat(m[1], 64)
	w.Seconds, _ = strconv.ParseFloat(m[2], 64)
	switch m[3] {
	case "us":
		w.Seconds /= 1e6
	case "ms":
		w.Seconds /= 1e3
	case "m":
		w.Seconds *= 60
	}
	w.RPS, _ = strconv.ParseFloat(r[1], 64)
	return w, nil
}
