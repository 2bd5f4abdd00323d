package config

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gymtrace/gymtrace/internal/groups"
)

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
	{Flag: "gym-metrics", Default: "true", IsBool: true,
		Usage: "make Gym's metrics (gym.rollout.duration_ms, gym.verify.*, gym.servers.active, http.server.*) from the traced traffic, gated by the span groups, exported over OTLP and on --metrics-addr",
		apply: func(c *Config, v value) error { return setBool(&c.GymMetrics, v) }},
	{Flag: "pressure-interval", Default: "5s",
		Usage: "how often Gym's process and host pressure gauges (gym.process.cpu.percent, gym.process_tree.*, gym.host.memory_*) are sampled from /proc, a Go duration of at least 1s; 0 turns them off",
		apply: func(c *Config, v value) error {
			d, err := time.ParseDuration(strings.TrimSpace(v.s))
			if err != nil || d != 0 && d < time.Second {
				return fmt.Errorf("%q is not 0 or a duration of at least 1s; write it with a unit, e.g. 5s (CPU times move in 10 ms ticks, so a shorter interval reads coarse percentages)", v.s)
			}
			c.PressureInterval = d
			return nil
		}},
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
	{Flag: "reward", Default: "true", IsBool: true,
		Usage: "read only the reward number from /verify response bodies, behind the verify span group (read only while it is enabled; only that number leaves the kernel)",
		apply: func(c *Config, v value) error { return setBool(&c.Reward, v) }},
	{Flag: "genai", Default: "true", IsBool: true,
		Usage: "read only model names and token counts from model servers' bodies (model_call or rollout groups; only those values leave the kernel): gen_ai.* attributes and per-rollout token totals",
		apply: func(c *Config, v value) error { return setBool(&c.GenAI, v) }},
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
