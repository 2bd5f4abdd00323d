// Package config builds gymtrace's settings from, in rising precedence:
// defaults, a YAML file (--config: Gym's own `telemetry:` block and a
// `gymtrace:` section), environment variables (OTEL_* then GYMTRACE_*), and
// command-line flags. Every setting has a flag, a GYMTRACE_ variable and a
// `gymtrace:` key; Settings lists them and the README's table mirrors it.
package config

import (
	"log/slog"
	"sort"
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
	Exporter     string // otlp, tree or jsonl
	Output       string // where tree and jsonl write; "-" is stdout
	MetricsAddr  string // Prometheus /metrics and /healthz listen address; "" is off
	GymMetrics   bool   // Gym's metrics from the traced traffic (internal/gymmetrics)
	// PressureInterval is how often process and host pressure is sampled
	// from /proc (internal/pressure); 0 is off.
	PressureInterval time.Duration
	SampleRatio      float64 // fraction of traces kept, 0..1, decided per trace id
	Inject           bool    // add traceparent to outbound requests that lack one
	InjectForce      bool    // inject even where the start-up self-test found a kernel misreport (inject.SelfTest)
	RolloutIDs       bool    // read rollout ids from /run request bodies in the kernel
	Reward           bool    // read the reward number from /verify response bodies in the kernel (verify group)
	GenAI            bool    // read model names and token counts from model servers' bodies in the kernel (model_call or rollout)
	RingbufBytes     int     // BPF ring-buffer size, a power of two
	LogLevel         string  // debug, info, warn, error
	ConfigPath       string  // the YAML file read, "" when none

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

func defaults() *Config {
	return &Config{
		SpanGroups:       groups.DefaultSpec,
		Discover:         true,
		OTLPTimeout:      10 * time.Second,
		Exporter:         ExporterAuto,
		Output:           "-",
		SampleRatio:      1,
		Inject:           true,
		GymMetrics:       true,
		PressureInterval: 5 * time.Second,
		RolloutIDs:       true,
		Reward:           true,
		GenAI:            true,
		RingbufBytes:     DefaultRingbufBytes,
		LogLevel:         "info",
		Sources:          map[string]string{},
	}
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
