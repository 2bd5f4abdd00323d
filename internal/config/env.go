package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

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
