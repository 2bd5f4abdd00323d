// Package config builds gymtrace's settings from, in rising precedence:
// defaults, a YAML file (--config: Gym's own `telemetry:` block and a
// `gymtrace:` section), environment variables (OTEL_* then GYMTRACE_*), and
// command-line flags. Every setting has a flag, a GYMTRACE_ variable and a
// `gymtrace:` key; Settings lists them and the README's table mirrors it.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gymtrace/gymtrace/internal/groups"
)

// PIDRole is a process named with --pid, and the Gym role it was given
// (groups.Role numbering, 0 = unknown: discovery decides).
type PIDRole struct {
	PID  int
	Role uint8
}

// Config is the resolved configuration. Load fills every field; Exporter is
// never "auto" after loading.
type Config struct {
	SpanGroups   string      // the span_groups spec as given
	Mask         groups.Mask // SpanGroups resolved
	PIDs         []PIDRole   // processes to trace, from --pid
	Discover     bool        // find Gym servers on the host (default: true unless --pid is given)
	OTLPEndpoint string      // OTLP/gRPC endpoint, a URL or host:port; "" when none
	OTLPInsecure bool        // plaintext gRPC (default: true for http:// endpoints)
	OTLPHeaders  map[string]string
	OTLPTimeout  time.Duration
	Exporter     string  // otlp, tree or jsonl
	Output       string  // where tree and jsonl write; "-" is stdout
	MetricsAddr  string  // Prometheus /metrics and /healthz listen address; "" is off
	SampleRatio  float64 // fraction of traces kept, 0..1, decided per trace id
	Inject       bool    // add traceparent to outbound requests that lack one
	InjectForce  bool    // inject even where the start-up self-test found a kernel misreport (inject.SelfTest)
	RolloutIDs   bool    // read rollout ids from /run request bodies in the kernel
	RingbufBytes int     // BPF ring-buffer size, a power of two
	LogLevel     string  // debug, info, warn, error
	ConfigPath   string  // the YAML file read, "" when none

	// Args holds the positional arguments left after the flags.
	Args []string
	// Sources names where each setting came from, keyed by its flag name
	// ("span-groups": `env GYMTRACE_SPAN_GROUPS`). Defaults are absent.
	Sources map[string]string
}

// Level is LogLevel as a slog.Level.
func (c *Config) Level() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return slog.LevelInfo
	}
	return l
}

// Source reports where a setting (by flag name) came from, "default" when
// nothing set it.
func (c *Config) Source(flagName string) string {
	if s, ok := c.Sources[flagName]; ok {
		return s
	}
	return "default"
}

// Exporter names.
const (
	ExporterAuto  = "auto"
	ExporterOTLP  = "otlp"
	ExporterTree  = "tree"
	ExporterJSONL = "jsonl"
)

// DefaultRingbufBytes is the default ring-buffer size, 8 MiB.
const DefaultRingbufBytes = 8 << 20

// Setting describes one configuration setting and all the places it can be
// given.
type Setting struct {
	Flag    string   // flag name without dashes, e.g. "span-groups"
	Env     string   // GYMTRACE_SPAN_GROUPS
	YAML    string   // key in the `gymtrace:` section, e.g. "span_groups"
	Default string   // as shown to users
	Usage   string   // one line
	Also    []string // other sources, lowest precedence first (OTEL_* vars, telemetry.* keys)
	IsBool  bool

	apply func(c *Config, v value) error
}

// value is one raw setting value and where it came from.
type value struct {
	s   string
	kv  map[string]string // a YAML mapping (otlp_headers)
	src string            // for error messages: "flag --pid", "env GYMTRACE_PID", "g.yaml:3 gymtrace.pid"
}

func (v value) String() string { return v.s }

var settings = []Setting{
	{Flag: "span-groups", Default: groups.DefaultSpec, Also: []string{"telemetry.span_groups"},
		Usage: `span groups to trace: a preset (default, per_rollout, all) or a comma-separated list; "" traces nothing`,
		apply: func(c *Config, v value) error { c.SpanGroups = v.s; return nil }},
	{Flag: "pid", Default: "",
		Usage: "trace these processes: PID or PID=ROLE, comma-separated or repeated (ROLE: agent, model, resources, orchestrator)",
		apply: func(c *Config, v value) error {
			p, err := ParsePIDs(v.s)
			c.PIDs = p
			return err
		}},
	{Flag: "discover", Default: "true unless --pid is given", IsBool: true,
		Usage: "find Gym server processes on the host (and the ones started later)",
		apply: func(c *Config, v value) error { return setBool(&c.Discover, v) }},
	{Flag: "otlp-endpoint", Default: "", Also: []string{"telemetry.otlp_endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		Usage: "OTLP/gRPC endpoint (URL or host:port), e.g. http://localhost:4317",
		apply: func(c *Config, v value) error { c.OTLPEndpoint = strings.TrimSpace(v.s); return nil }},
	{Flag: "otlp-insecure", Default: "true for http:// endpoints", IsBool: true, Also: []string{"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE"},
		Usage: "send OTLP without TLS",
		apply: func(c *Config, v value) error { return setBool(&c.OTLPInsecure, v) }},
	{Flag: "otlp-headers", Default: "", Also: []string{"telemetry.otlp_headers", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"},
		Usage: "OTLP request headers, key=value,key2=value2 (values URL-encoded); never logged",
		apply: func(c *Config, v value) error {
			if v.kv != nil {
				c.OTLPHeaders = v.kv
				return nil
			}
			h, err := ParseHeaders(v.s)
			c.OTLPHeaders = h
			return err
		}},
	{Flag: "otlp-timeout", Default: "10s", Also: []string{"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"},
		Usage: "timeout of one OTLP export, a Go duration (10s, 500ms)",
		apply: func(c *Config, v value) error {
			d, err := time.ParseDuration(strings.TrimSpace(v.s))
			if err != nil || d <= 0 {
				return fmt.Errorf("%q is not a positive duration; write it with a unit, e.g. 10s or 500ms", v.s)
			}
			c.OTLPTimeout = d
			return nil
		}},
	{Flag: "exporter", Default: ExporterAuto,
		Usage: "where spans go: auto (otlp when an endpoint is set, else tree), otlp, tree (trace trees on the terminal), jsonl",
		apply: func(c *Config, v value) error {
			e := strings.ToLower(strings.TrimSpace(v.s))
			switch e {
			case ExporterAuto, ExporterOTLP, ExporterTree, ExporterJSONL:
				c.Exporter = e
				return nil
			}
			return fmt.Errorf("unknown exporter %q; use auto, otlp, tree or jsonl", v.s)
		}},
	{Flag: "output", Default: "-",
		Usage: `file the tree and jsonl exporters write to; "-" is stdout`,
		apply: func(c *Config, v value) error {
			if v.s == "" {
				return errors.New(`output must not be empty; use "-" for stdout or a file path`)
			}
			c.Output = v.s
			return nil
		}},
	{Flag: "metrics-addr", Default: "",
		Usage: `serve Prometheus /metrics and /healthz on this address, e.g. :9464 ("" is off)`,
		apply: func(c *Config, v value) error { c.MetricsAddr = strings.TrimSpace(v.s); return nil }},
	{Flag: "sample-ratio", Default: "1", Also: []string{"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"},
		Usage: "fraction of traces to keep, 0 to 1, decided by trace id so every process agrees",
		apply: func(c *Config, v value) error {
			r, err := parseRatio(v.s)
			c.SampleRatio = r
			return err
		}},
	{Flag: "inject", Default: "true", IsBool: true,
		Usage: "add a traceparent header to outbound Gym requests that lack one, so processes on other hosts join the trace",
		apply: func(c *Config, v value) error { return setBool(&c.Inject, v) }},
	{Flag: "inject-force", Default: "false", IsBool: true,
		Usage: "inject even on a kernel where the start-up self-test finds that sockets in the injection sockhash misreport their state (ioctl(FIONREAD)); the traced programs then see that misreport",
		apply: func(c *Config, v value) error { return setBool(&c.InjectForce, v) }},
	{Flag: "rollout-ids", Default: "true", IsBool: true,
		Usage: "read _ng_rollout_id and the task/rollout indexes from /run request bodies (only those values leave the kernel)",
		apply: func(c *Config, v value) error { return setBool(&c.RolloutIDs, v) }},
	{Flag: "ringbuf-bytes", Default: "8MiB",
		Usage: "BPF ring-buffer size: a power of two, at least one page (bytes, or with KiB/MiB/GiB)",
		apply: func(c *Config, v value) error {
			n, err := ParseSize(v.s)
			c.RingbufBytes = n
			return err
		}},
	{Flag: "log-level", Default: "info",
		Usage: "debug, info, warn or error",
		apply: func(c *Config, v value) error {
			l := strings.ToLower(strings.TrimSpace(v.s))
			switch l {
			case "debug", "info", "warn", "error":
				c.LogLevel = l
				return nil
			case "warning":
				c.LogLevel = "warn"
				return nil
			}
			return fmt.Errorf("unknown log level %q; use debug, info, warn or error", v.s)
		}},
	{Flag: "config", Default: "",
		Usage: "YAML file: Gym's own config (its telemetry: block) and/or a gymtrace: section",
		apply: func(c *Config, v value) error { c.ConfigPath = v.s; return nil }},
}

func init() {
	for i := range settings {
		s := &settings[i]
		s.Env = "GYMTRACE_" + strings.ToUpper(strings.ReplaceAll(s.Flag, "-", "_"))
		s.YAML = strings.ReplaceAll(s.Flag, "-", "_")
	}
}

// Settings returns every setting in documentation order.
func Settings() []Setting {
	out := make([]Setting, len(settings))
	for i, s := range settings {
		s.Also = append([]string(nil), s.Also...)
		out[i] = s
	}
	return out
}

func settingByFlag(name string) *Setting {
	for i := range settings {
		if settings[i].Flag == name {
			return &settings[i]
		}
	}
	return nil
}

func defaults() *Config {
	return &Config{
		SpanGroups:   groups.DefaultSpec,
		Discover:     true,
		OTLPTimeout:  10 * time.Second,
		Exporter:     ExporterAuto,
		Output:       "-",
		SampleRatio:  1,
		Inject:       true,
		RolloutIDs:   true,
		RingbufBytes: DefaultRingbufBytes,
		LogLevel:     "info",
		Sources:      map[string]string{},
	}
}

// Loader loads a Config and can load it again (Reload) when the process gets
// SIGHUP: the flags stay as given at start, the file and the environment are
// read anew.
type Loader struct {
	Args      []string                     // command-line flags (and positional arguments)
	LookupEnv func(string) (string, bool)  // os.LookupEnv when nil
	ReadFile  func(string) ([]byte, error) // os.ReadFile when nil
	Log       *slog.Logger                 // notes about ignored or overridden input; discarded when nil
}

// NewLoader returns a Loader over the process environment.
func NewLoader(args []string, log *slog.Logger) *Loader {
	return &Loader{Args: args, Log: log}
}

// Load parses the flags and reads the file and environment. It returns
// flag.ErrHelp for -h/--help. Any other error says which input was wrong and
// what to do; the caller should exit with status 2.
func (l *Loader) Load() (*Config, error) {
	if l.LookupEnv == nil {
		l.LookupEnv = os.LookupEnv
	}
	if l.ReadFile == nil {
		l.ReadFile = os.ReadFile
	}
	if l.Log == nil {
		l.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}

	flags, args, err := parseFlags(l.Args)
	if err != nil {
		return nil, err
	}
	gtEnv := l.gymtraceEnv()
	otelEnv, err := l.otelEnv()
	if err != nil {
		return nil, err
	}

	cfg := defaults()
	cfg.Args = args

	// The config path itself: flag beats env.
	if v, ok := flags["config"]; ok {
		cfg.ConfigPath, cfg.Sources["config"] = v.s, v.src
	} else if v, ok := gtEnv["config"]; ok {
		cfg.ConfigPath, cfg.Sources["config"] = v.s, v.src
	}
	var telemetry, section map[string]value
	if cfg.ConfigPath != "" {
		data, err := l.ReadFile(cfg.ConfigPath)
		if err != nil {
			return nil, fmt.Errorf("reading config file: %w (give a readable YAML file with --config or GYMTRACE_CONFIG)", err)
		}
		telemetry, section, err = parseFile(cfg.ConfigPath, data, l.LookupEnv, l.Log)
		if err != nil {
			return nil, err
		}
	}

	// Lowest precedence first; for each setting the last layer that has it wins.
	layers := []map[string]value{telemetry, section, otelEnv, gtEnv, flags}
	for i := range settings {
		s := &settings[i]
		if s.Flag == "config" {
			continue
		}
		var win *value
		for _, layer := range layers {
			if v, ok := layer[s.Flag]; ok {
				v := v
				win = &v
			}
		}
		if win == nil {
			continue
		}
		if err := s.apply(cfg, *win); err != nil {
			return nil, fmt.Errorf("%s: %w", win.src, err)
		}
		cfg.Sources[s.Flag] = win.src
	}

	if err := finish(cfg); err != nil {
		return nil, err
	}
	for _, s := range settings {
		if src, ok := cfg.Sources[s.Flag]; ok && s.Flag != "otlp-headers" {
			l.Log.Debug("setting", "name", s.Flag, "from", src)
		}
	}
	return cfg, nil
}

// Reload loads the configuration again, for SIGHUP. It is Load under another
// name so a caller's intent reads clearly: on error, keep running with the
// previous Config and log the error.
func (l *Loader) Reload() (*Config, error) { return l.Load() }

// finish derives the settings that depend on others and checks the whole.
func finish(c *Config) error {
	m, err := groups.Resolve(c.SpanGroups)
	if err != nil {
		return fmt.Errorf("%s: %w", c.Source("span-groups"), err)
	}
	c.Mask = m
	if _, ok := c.Sources["discover"]; !ok {
		c.Discover = len(c.PIDs) == 0
	}
	if _, ok := c.Sources["otlp-insecure"]; !ok {
		c.OTLPInsecure = strings.HasPrefix(strings.ToLower(c.OTLPEndpoint), "http://")
	}
	if c.Exporter == ExporterAuto {
		c.Exporter = ExporterTree
		if c.OTLPEndpoint != "" {
			c.Exporter = ExporterOTLP
		}
	}
	if c.Exporter == ExporterOTLP && c.OTLPEndpoint == "" {
		return fmt.Errorf("%s: the otlp exporter needs an endpoint; set --otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT), or pick --exporter tree or jsonl", c.Source("exporter"))
	}
	if c.OTLPEndpoint != "" {
		if err := checkEndpoint(c.OTLPEndpoint); err != nil {
			return fmt.Errorf("%s: %w", c.Source("otlp-endpoint"), err)
		}
	}
	if !c.Discover && len(c.PIDs) == 0 {
		return fmt.Errorf("%s: discovery is off and no --pid is given, so there is nothing to trace; give --pid or drop --discover=false", c.Source("discover"))
	}
	return nil
}

func checkEndpoint(e string) error {
	if strings.Contains(e, "://") {
		u, err := url.Parse(e)
		if err != nil || u.Host == "" {
			return fmt.Errorf("OTLP endpoint %q is not a URL with a host; write it as http://host:4317 or host:4317", e)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return fmt.Errorf("OTLP endpoint %q has scheme %q; gymtrace speaks OTLP/gRPC over http:// (plaintext) or https://", e, u.Scheme)
		}
		return nil
	}
	if strings.ContainsAny(e, "/ ") {
		return fmt.Errorf("OTLP endpoint %q is neither a URL nor host:port; write it as http://host:4317 or host:4317", e)
	}
	return nil
}

// ParsePIDs parses a --pid value: comma-separated PID or PID=ROLE items, with
// ROLE as groups.ParseRole accepts. Empty items are skipped.
func ParsePIDs(s string) ([]PIDRole, error) {
	var out []PIDRole
	seen := map[int]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		pidStr, roleStr, hasRole := strings.Cut(item, "=")
		pid, err := strconv.Atoi(strings.TrimSpace(pidStr))
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("bad pid %q: write a process id, optionally with a role, e.g. --pid 1234 or --pid 1234=agent", item)
		}
		var role groups.Role
		if hasRole {
			if role, err = groups.ParseRole(roleStr); err != nil {
				return nil, fmt.Errorf("pid %d: %w", pid, err)
			}
		}
		if seen[pid] {
			return nil, fmt.Errorf("pid %d is given twice; give each process once", pid)
		}
		seen[pid] = true
		out = append(out, PIDRole{PID: pid, Role: uint8(role)})
	}
	return out, nil
}

// ParseHeaders parses the OTEL_EXPORTER_OTLP_HEADERS format:
// key=value pairs separated by commas, values URL-encoded.
func ParseHeaders(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(s, ",") {
		if strings.TrimSpace(item) == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			// Only the key is shown: the value may be a credential.
			return nil, fmt.Errorf("bad header %q: write key=value pairs separated by commas", k)
		}
		dv, err := url.QueryUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("header %q: the value is not URL-encoded correctly (escape %%, commas and spaces)", k)
		}
		out[strings.ToLower(k)] = dv
	}
	return out, nil
}

// ParseSize parses a byte size: a plain number or one with a binary suffix
// (K, KB, KiB, M, MB, MiB, G, GB, GiB, all powers of 1024). For the ring
// buffer it must also be a power of two and at least one page.
func ParseSize(s string) (int, error) {
	t := strings.TrimSpace(s)
	mult := 1
	for _, suf := range []struct {
		s string
		m int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(suf.s)) {
			t, mult = strings.TrimSpace(t[:len(t)-len(suf.s)]), suf.m
			break
		}
	}
	n, err := strconv.ParseUint(t, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("ring-buffer size %q is not a number of bytes; write e.g. 8MiB or 8388608", s)
	}
	size := uint64(n) * uint64(mult)
	page := uint64(os.Getpagesize())
	if size < page || size > 1<<30 || size&(size-1) != 0 {
		return 0, fmt.Errorf("ring-buffer size %q must be a power of two between %d bytes (one page) and 1GiB, e.g. 4MiB, 8MiB, 16MiB", s, page)
	}
	return int(size), nil
}

func parseRatio(s string) (float64, error) {
	r, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(r) || r < 0 || r > 1 {
		return 0, fmt.Errorf("sample ratio %q must be a number from 0 to 1 (1 keeps every trace, 0.1 keeps one in ten)", s)
	}
	return r, nil
}

func setBool(dst *bool, v value) error {
	switch strings.ToLower(strings.TrimSpace(v.s)) {
	case "1", "t", "true", "yes", "on":
		*dst = true
	case "0", "f", "false", "no", "off":
		*dst = false
	default:
		return fmt.Errorf("%q is not a boolean; use true or false", v.s)
	}
	return nil
}

// gymtraceEnv reads the GYMTRACE_* variables. An empty variable is not given,
// except GYMTRACE_SPAN_GROUPS, where empty selects no group.
func (l *Loader) gymtraceEnv() map[string]value {
	out := map[string]value{}
	for _, s := range settings {
		v, ok := l.LookupEnv(s.Env)
		if !ok || (v == "" && s.Flag != "span-groups") {
			continue
		}
		out[s.Flag] = value{s: v, src: "env " + s.Env}
	}
	return out
}

// otelEnv maps the standard OpenTelemetry SDK variables onto settings; the
// signal-specific TRACES_ form wins over the generic one, as in the SDKs.
// Empty variables are unset, as the OTel specification says.
func (l *Loader) otelEnv() (map[string]value, error) {
	out := map[string]value{}
	get := func(names ...string) (string, string, bool) {
		for _, n := range names {
			if v, ok := l.LookupEnv(n); ok && strings.TrimSpace(v) != "" {
				return strings.TrimSpace(v), n, true
			}
		}
		return "", "", false
	}
	if v, n, ok := get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"); ok {
		out["otlp-endpoint"] = value{s: v, src: "env " + n}
	}
	if v, n, ok := get("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE"); ok {
		out["otlp-insecure"] = value{s: v, src: "env " + n}
	}
	if v, n, ok := get("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"); ok {
		out["otlp-headers"] = value{s: v, src: "env " + n}
	}
	if v, n, ok := get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"); ok {
		ms, err := strconv.ParseUint(v, 10, 32)
		if err != nil || ms == 0 {
			return nil, fmt.Errorf("env %s: %q is not a positive number of milliseconds", n, v)
		}
		out["otlp-timeout"] = value{s: (time.Duration(ms) * time.Millisecond).String(), src: "env " + n}
	}
	if v, n, ok := get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); ok && v != "grpc" {
		l.Log.Warn("gymtrace exports OTLP over gRPC only; ignoring the protocol setting", "env", n, "protocol", v)
	}
	if sampler, n, ok := get("OTEL_TRACES_SAMPLER"); ok {
		src := "env " + n
		switch strings.ToLower(sampler) {
		case "always_on", "parentbased_always_on":
			out["sample-ratio"] = value{s: "1", src: src}
		case "always_off", "parentbased_always_off":
			out["sample-ratio"] = value{s: "0", src: src}
		case "traceidratio", "parentbased_traceidratio":
			arg, an, ok := get("OTEL_TRACES_SAMPLER_ARG")
			if !ok {
				arg, an = "1", n
			}
			if _, err := parseRatio(arg); err != nil {
				return nil, fmt.Errorf("env %s: %w", an, err)
			}
			out["sample-ratio"] = value{s: arg, src: "env " + an}
		default:
			l.Log.Warn("unsupported OTEL_TRACES_SAMPLER; keeping every trace unless --sample-ratio says otherwise",
				"sampler", sampler, "supported", "always_on, always_off, traceidratio, parentbased_traceidratio")
		}
	}
	return out, nil
}

// flagValue collects one flag's raw values; --pid may repeat.
type flagValue struct {
	name   string
	isBool bool
	vals   []string
}

func (f *flagValue) String() string     { return strings.Join(f.vals, ",") }
func (f *flagValue) Set(s string) error { f.vals = append(f.vals, s); return nil }
func (f *flagValue) IsBoolFlag() bool   { return f.isBool }

// NewFlagSet returns the flag set of `gymtrace run` with every setting.
// Values are collected raw and interpreted by Load, so a flag is validated
// with the same code as its env var and YAML key.
func NewFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, s := range settings {
		fs.Var(&flagValue{name: s.Flag, isBool: s.IsBool}, s.Flag, s.Usage)
	}
	fs.Usage = func() {}
	return fs
}

func parseFlags(args []string) (map[string]value, []string, error) {
	fs := NewFlagSet("gymtrace")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, flag.ErrHelp
		}
		return nil, nil, fmt.Errorf("%v (see gymtrace --help)", err)
	}
	out := map[string]value{}
	fs.Visit(func(f *flag.Flag) {
		fv := f.Value.(*flagValue)
		v := fv.vals[len(fv.vals)-1]
		if fv.name == "pid" {
			v = strings.Join(fv.vals, ",")
		}
		out[fv.name] = value{s: v, src: "flag --" + fv.name}
	})
	return out, fs.Args(), nil
}

// WriteFlagHelp prints the settings as `--help` shows them.
func WriteFlagHelp(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range settings {
		arg := " VALUE"
		if s.IsBool {
			arg = "[=BOOL]"
		}
		def := ""
		if s.Default != "" {
			def = " (default: " + s.Default + ")"
		}
		fmt.Fprintf(tw, "  --%s%s\t%s%s\n", s.Flag, arg, s.Usage, def)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\nEvery flag is also the env var GYMTRACE_<FLAG> (e.g. GYMTRACE_SPAN_GROUPS) and the key <flag> in snake_case\n"+
		"under `gymtrace:` in the --config file. Precedence: flags > env > file > defaults.")
	return err
}

// sortedKeys is used for stable error messages.
func sortedKeys[M ~map[string]V, V any](m M) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
