package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"

	"github.com/gymtrace/gymtrace/internal/agent"
	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/groups"
)

// version is set at link time: -ldflags "-X main.version=v0.1.0". Without it
// the module version or VCS revision from the build info is shown.
var version = ""

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and failed
	exitUsage   = 2 // bad command line, environment or config file
)

var commands = []struct{ name, args, help string }{
	{"run", "[flags]", "trace Gym servers on this host until interrupted (the default command)"},
	{"groups", "[SPEC]", "print the groups SPEC selects (or the configured span_groups), one per line"},
	{"check", "[flags]", "check this machine for every kernel feature gymtrace uses"},
	{"demo", "[flags]", "start a Gym-shaped stack, trace it and print its trace trees"},
	{"version", "", "print the version"},
	{"help", "", "print this help"},
}

// runCLI is main without os.Exit, so tests can run the command in-process.
func runCLI(ctx context.Context, args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) (code int) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "gymtrace: internal error: %v (please report it with the output of `gymtrace version`)\n", r)
			if v, _ := lookupEnv("GYMTRACE_LOG_LEVEL"); strings.EqualFold(v, "debug") {
				stderr.Write(debug.Stack())
			}
			code = exitFailure
		}
	}()

	cmd, rest := "run", args
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, rest = args[0], args[1:]
	}
	switch cmd {
	case "help":
		writeHelp(stdout)
		return exitOK
	case "version":
		fmt.Fprintln(stdout, versionString())
		return exitOK
	case "groups":
		return cmdGroups(rest, stdout, stderr, lookupEnv)
	case "run", "check", "demo":
	default:
		fmt.Fprintf(stderr, "gymtrace: unknown command %q; commands: run, groups, check, demo, version, help\n", cmd)
		return exitUsage
	}

	cfg, loader, log, lv, code := loadConfig(rest, stdout, stderr, lookupEnv)
	if cfg == nil {
		return code
	}
	if len(cfg.Args) > 0 {
		fmt.Fprintf(stderr, "gymtrace: %s takes no arguments, got %q (see gymtrace --help)\n", cmd, strings.Join(cfg.Args, " "))
		return exitUsage
	}
	if cmd != "check" {
		warnJoin(log, cfg.Mask)
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, let a second one kill a stuck shutdown.
	go func() { <-ctx.Done(); stop() }()
	hup := installReloadHook(loader, lv)
	defer hup()

	if path, ok := lookupEnv("GYMTRACE_CPUPROFILE"); ok && path != "" && cmd != "check" {
		// A debugging knob for performance work (docs/performance.md): the
		// agent's CPU profile, written when it stops.
		done, err := startCPUProfile(path)
		if err != nil {
			fmt.Fprintf(stderr, "gymtrace: GYMTRACE_CPUPROFILE: %v\n", err)
			return exitUsage
		}
		defer done()
	}

	var err error
	switch cmd {
	case "run":
		err = agent.Run(ctx, cfg, agent.Options{Log: log, Reloads: reloadsFor(log)})
	case "demo":
		err = runDemo(ctx, cfg, log)
	case "check":
		var ok bool
		ok, err = runCheck(ctx, cfg, stdout)
		if err == nil && !ok {
			fmt.Fprintln(stderr, "gymtrace: this machine lacks a feature gymtrace requires (see the table above for what to do)")
			return exitFailure
		}
	}
	if err != nil && !(errors.Is(err, context.Canceled) && ctx.Err() != nil) {
		fmt.Fprintf(stderr, "gymtrace: %s\n", oneLine(err))
		var ue agent.UsageError
		if errors.As(err, &ue) {
			return exitUsage
		}
		return exitFailure
	}
	return exitOK
}

// reloadsFor is the agent's reload source: SIGHUP, through watchReloads.
func reloadsFor(log *slog.Logger) func(context.Context, func(*config.Config) error) {
	return func(ctx context.Context, apply func(*config.Config) error) { watchReloads(ctx, log, apply) }
}

// loadConfig loads the configuration and builds the logger at its level. On
// failure it has printed what to do and returns a nil config and the exit code.
func loadConfig(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) (*config.Config, *config.Loader, *slog.Logger, *slog.LevelVar, int) {
	lv := new(slog.LevelVar)
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	// Notes made while loading are kept until the configured level is known.
	early := &recordBuffer{}
	loader := &config.Loader{Args: args, LookupEnv: lookupEnv, Log: slog.New(early)}
	cfg, err := loader.Load()
	if errors.Is(err, flag.ErrHelp) {
		writeHelp(stdout)
		return nil, nil, nil, nil, exitOK
	}
	if err != nil {
		early.replay(log.Handler())
		fmt.Fprintf(stderr, "gymtrace: %s\n", oneLine(err))
		return nil, nil, nil, nil, exitUsage
	}
	lv.Set(cfg.Level())
	early.replay(log.Handler())
	loader.Log = log
	return cfg, loader, log, lv, exitOK
}

func cmdGroups(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	var (
		mask  groups.Mask
		specs = args
		log   = slog.New(slog.NewTextHandler(stderr, nil))
	)
	flagged := false
	for _, a := range args {
		flagged = flagged || strings.HasPrefix(a, "-")
	}
	if len(args) == 0 || flagged {
		// No SPEC, or flags such as --config: show what run would select.
		cfg, _, l, _, code := loadConfig(args, stdout, stderr, lookupEnv)
		if cfg == nil {
			return code
		}
		mask, specs, log = cfg.Mask, cfg.Args, l
	}
	if len(specs) > 0 {
		m, err := groups.Resolve(strings.Join(specs, ","))
		if err != nil {
			fmt.Fprintf(stderr, "gymtrace: %s\n", oneLine(err))
			return exitUsage
		}
		mask = m
	}
	for _, name := range mask.Names() {
		fmt.Fprintln(stdout, name)
	}
	if mask == groups.DefaultMask {
		// Gym's newer default has startup; say so where the preset is read.
		fmt.Fprintln(stderr, "gymtrace: note: "+groups.StartupNote)
	}
	warnJoin(log, mask)
	return exitOK
}

func warnJoin(log *slog.Logger, m groups.Mask) {
	if w := groups.JoinWarning(m); w != "" {
		log.Warn(w)
	}
}

// reloadHook connects SIGHUP to the config loader for the running command.
type reloadHook struct {
	mu     sync.Mutex
	sig    chan os.Signal
	loader *config.Loader
	level  *slog.LevelVar
}

var reloads reloadHook

// installReloadHook starts catching SIGHUP (so it never kills gymtrace) and
// remembers the loader for watchReloads. The returned func uninstalls it.
func installReloadHook(l *config.Loader, lv *slog.LevelVar) func() {
	reloads.mu.Lock()
	defer reloads.mu.Unlock()
	reloads.sig = make(chan os.Signal, 1)
	reloads.loader, reloads.level = l, lv
	signal.Notify(reloads.sig, syscall.SIGHUP)
	sig := reloads.sig
	return func() { signal.Stop(sig) }
}

// watchReloads is for the agent: it blocks until ctx ends and, after each
// SIGHUP, loads the configuration again (file and environment re-read, flags
// as given at start) and passes it to apply, e.g. to write the new span-group
// mask into the kernel. When loading fails it logs why and keeps the running
// configuration; an apply error is logged the same way.
func watchReloads(ctx context.Context, log *slog.Logger, apply func(*config.Config) error) {
	reloads.mu.Lock()
	sig, loader, level := reloads.sig, reloads.loader, reloads.level
	reloads.mu.Unlock()
	if sig == nil || loader == nil {
		<-ctx.Done()
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
		}
		cfg, err := loader.Reload()
		if err != nil {
			log.Error("SIGHUP: config not reloaded; keeping the running one", "err", oneLine(err))
			continue
		}
		if level != nil {
			level.Set(cfg.Level())
		}
		warnJoin(log, cfg.Mask)
		if err := apply(cfg); err != nil {
			log.Error("SIGHUP: applying the reloaded config failed", "err", oneLine(err))
			continue
		}
		log.Info("config reloaded", "span_groups", cfg.Mask.String())
	}
}

func writeHelp(w io.Writer) {
	fmt.Fprint(w, `gymtrace traces NeMo Gym's servers from the kernel, with no code change: it turns their
HTTP traffic into the spans Gym's own telemetry names, gated by span group in the kernel.

Usage:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  gymtrace %-17s %s\n", strings.TrimSpace(c.name+" "+c.args), c.help)
	}
	fmt.Fprint(w, "\nFlags (run, check, demo; groups takes --config and --span-groups):\n")
	config.WriteFlagHelp(w)
	fmt.Fprint(w, "\nSpan groups (--span-groups takes a preset or a comma-separated list of presets and groups):\n\n")
	groups.WriteTable(w)
	fmt.Fprint(w, `
server and http_client are the two halves of trace joining: http_client writes the
traceparent header and server reads it. Without either, each process produces its own
disconnected trace.

Examples:
  sudo gymtrace --span-groups per_rollout
  sudo gymtrace --span-groups "default,sandbox"
  sudo gymtrace --pid 1234=agent --otlp-endpoint http://localhost:4317
  gymtrace groups "server,http_client,verify"

Exit status: 0 ok, 1 runtime failure, 2 usage or configuration error.
`)
}

func versionString() string {
	v := version
	rev := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = s.Value[:12]
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	out := "gymtrace " + v
	if rev != "" {
		out += " (" + rev + ")"
	}
	return out + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
}

// oneLine keeps an error on one line: multi-line detail (a verifier log) is
// logged by the code that has it, the final word is a single line.
func oneLine(err error) string {
	s := strings.TrimSpace(err.Error())
	s = strings.ReplaceAll(s, "\r", "")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " | ")), " ")
}

// recordBuffer is a slog.Handler that keeps records for later, so notes made
// while the config loads are filtered by the level the config sets.
type recordBuffer struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (b *recordBuffer) Enabled(context.Context, slog.Level) bool { return true }
func (b *recordBuffer) Handle(_ context.Context, r slog.Record) error {
	b.mu.Lock()
	b.recs = append(b.recs, r.Clone())
	b.mu.Unlock()
	return nil
}

// WithAttrs and WithGroup are not used by the config loader; attributes given
// through them would be dropped.
func (b *recordBuffer) WithAttrs([]slog.Attr) slog.Handler { return b }
func (b *recordBuffer) WithGroup(string) slog.Handler      { return b }

func (b *recordBuffer) replay(h slog.Handler) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.recs {
		if h.Enabled(context.Background(), r.Level) {
			h.Handle(context.Background(), r)
		}
	}
	b.recs = nil
}
