package config

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gymtrace/gymtrace/internal/groups"
)

// load runs a Loader over args, a fake environment and optional file text.
func load(t *testing.T, args []string, env map[string]string, file string) (*Config, error) {
	t.Helper()
	l := &Loader{
		Args: args,
		LookupEnv: func(k string) (string, bool) {
			v, ok := env[k]
			return v, ok
		},
	}
	if file != "" {
		p := filepath.Join(t.TempDir(), "gym.yaml")
		if err := os.WriteFile(p, []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		l.Args = append([]string{"--config", p}, args...)
	}
	return l.Load()
}

func mustLoad(t *testing.T, args []string, env map[string]string, file string) *Config {
	t.Helper()
	c, err := load(t, args, env, file)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error containing %q, got none", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q lacks %q", err, p)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
}

func TestDefaults(t *testing.T) {
	c := mustLoad(t, nil, nil, "")
	want := &Config{
		SpanGroups: "default", Mask: groups.DefaultMask, Discover: true, OTLPTimeout: 10 * time.Second,
		Exporter: "tree", Output: "-", SampleRatio: 1, Inject: true, RolloutIDs: true, Reward: true, GenAI: true, GymMetrics: true,
		PressureInterval: 5 * time.Second, RingbufBytes: 8 << 20, LogLevel: "info", Sources: map[string]string{},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", c, want)
	}
	if c.Level() != slog.LevelInfo || c.Source("span-groups") != "default" {
		t.Error("Level/Source")
	}
}

func TestSpanGroupsPrecedence(t *testing.T) {
	file := "gymtrace:\n  span_groups: all\n"
	env := map[string]string{"GYMTRACE_SPAN_GROUPS": "per_rollout"}

	if c := mustLoad(t, nil, nil, file); c.Mask != groups.AllMask {
		t.Errorf("file: %v", c.Mask.Names())
	}
	c := mustLoad(t, nil, env, file)
	if c.Mask != groups.PerRolloutMask || c.Source("span-groups") != "env GYMTRACE_SPAN_GROUPS" {
		t.Errorf("env over file: %v from %s", c.Mask.Names(), c.Source("span-groups"))
	}
	c = mustLoad(t, []string{"--span-groups", "Default, sandbox"}, env, file)
	if c.Mask.String() != "http_client,job,rollout,sandbox,server" || c.Source("span-groups") != "flag --span-groups" {
		t.Errorf("flag over env: %v", c.Mask.Names())
	}
	// Set but empty: every group off, even over a file that selects some.
	c = mustLoad(t, nil, map[string]string{"GYMTRACE_SPAN_GROUPS": ""}, file)
	if c.Mask != 0 || c.SpanGroups != "" {
		t.Errorf("empty env: %v", c.Mask.Names())
	}
	// An empty flag likewise.
	if c := mustLoad(t, []string{"--span-groups="}, env, ""); c.Mask != 0 {
		t.Errorf("empty flag: %v", c.Mask.Names())
	}
	// `span_groups: ""` in the file selects nothing; a null is not given.
	if c := mustLoad(t, nil, nil, "gymtrace:\n  span_groups: \"\"\n"); c.Mask != 0 {
		t.Errorf("empty yaml: %v", c.Mask.Names())
	}
	if c := mustLoad(t, nil, nil, "gymtrace:\n  span_groups:\n"); c.Mask != groups.DefaultMask {
		t.Errorf("null yaml: %v", c.Mask.Names())
	}
	// A list in YAML is a comma-separated spec.
	if c := mustLoad(t, nil, nil, "gymtrace:\n  span_groups: [server, http_client, verify]\n"); c.Mask.String() != "http_client,server,verify" {
		t.Errorf("yaml list: %v", c.Mask.Names())
	}
}

func TestUnknownGroup(t *testing.T) {
	_, err := load(t, []string{"--span-groups", "defualt"}, nil, "")
	wantErr(t, err, "flag --span-groups", `"defualt"`, "valid options: agent, all, checkpoint, default, http_client")
	var ue *groups.UnknownError
	if !errors.As(err, &ue) {
		t.Error("the resolver's error is not wrapped")
	}
	_, err = load(t, nil, nil, "telemetry:\n  span_groups: default,sandbx\n")
	wantErr(t, err, "telemetry.span_groups", `"sandbx"`, "gym.yaml:2")
}

const gymConfig = `
policy_model:
  responses_api_models:
    vllm_model:
      entrypoint: app.py
telemetry:
  enabled: true
  service_name: nemo-gym
  span_groups: per_rollout
  exporter: otlp
  otlp_endpoint: http://collector:4317
  otlp_headers: "x-team=${oc.env:TEAM_KEY},x-env=${oc.env:DEPLOY_ENV,dev}"
  otlp_protocol: grpc
  metrics_enabled: true
`

func TestGymTelemetryBlock(t *testing.T) {
	c := mustLoad(t, nil, map[string]string{"TEAM_KEY": "s3cr3t"}, gymConfig)
	if c.Mask != groups.PerRolloutMask {
		t.Errorf("span groups %v", c.Mask.Names())
	}
	if c.OTLPEndpoint != "http://collector:4317" || c.Exporter != "otlp" || !c.OTLPInsecure {
		t.Errorf("otlp: %q %q insecure=%v", c.OTLPEndpoint, c.Exporter, c.OTLPInsecure)
	}
	if !reflect.DeepEqual(c.OTLPHeaders, map[string]string{"x-team": "s3cr3t", "x-env": "dev"}) {
		t.Errorf("headers %v", c.OTLPHeaders)
	}
	// An unset variable without default is an error that does not leak values.
	_, err := load(t, nil, nil, gymConfig)
	wantErr(t, err, "TEAM_KEY is not set", "telemetry.otlp_headers")
	// Interpolations other than oc.env are refused with a way out.
	_, err = load(t, nil, nil, "telemetry:\n  otlp_endpoint: ${policy_model.host}\n")
	wantErr(t, err, "only ${oc.env:VAR}", "gymtrace: section")
}

func TestSectionBeatsTelemetryBlock(t *testing.T) {
	c := mustLoad(t, nil, nil, "telemetry:\n  span_groups: all\n  otlp_endpoint: a:4317\ngymtrace:\n  span_groups: default\n  exporter: jsonl\n  output: /tmp/spans.jsonl\n")
	if c.Mask != groups.DefaultMask || c.Exporter != "jsonl" || c.Output != "/tmp/spans.jsonl" || c.OTLPEndpoint != "a:4317" {
		t.Errorf("%+v", c)
	}
	if c.OTLPInsecure {
		t.Error("host:port endpoints default to TLS")
	}
}

func TestEveryFlagInSection(t *testing.T) {
	file := `gymtrace:
  span_groups: per_rollout
  pid: [101, "102=agent", 103=responses_api_models]
  discover: true
  otlp_endpoint: https://otel.example:4317
  otlp_insecure: false
  otlp_headers: {Authorization: "Bearer x"}
  otlp_timeout: 3s
  exporter: otlp
  output: "-"
  metrics_addr: ":9464"
  gym_metrics: false
  pressure_interval: 2s
  sample_ratio: 0.25
  inject: false
  inject_force: true
  rollout_ids: no
  reward: false
  genai: false
  ringbuf_bytes: 16MiB
  log_level: debug
`
	c := mustLoad(t, nil, nil, file)
	want := []PIDRole{{101, 0}, {102, uint8(groups.RoleAgent)}, {103, uint8(groups.RoleModel)}}
	if !reflect.DeepEqual(c.PIDs, want) || !c.Discover {
		t.Errorf("pids %v discover %v", c.PIDs, c.Discover)
	}
	if c.OTLPEndpoint != "https://otel.example:4317" || c.OTLPInsecure || c.OTLPHeaders["authorization"] != "Bearer x" ||
		c.OTLPTimeout != 3*time.Second || c.Exporter != "otlp" || c.MetricsAddr != ":9464" || c.GymMetrics || c.PressureInterval != 2*time.Second || c.SampleRatio != 0.25 ||
		c.Inject || !c.InjectForce || c.RolloutIDs || c.Reward || c.GenAI || c.RingbufBytes != 16<<20 || c.LogLevel != "debug" || c.Level() != slog.LevelDebug {
		t.Errorf("%+v", c)
	}
	// Every setting but config must be settable in the section.
	for _, s := range Settings() {
		if s.Flag != "config" && !strings.Contains(file, "\n  "+s.YAML+":") {
			t.Errorf("setting %s is missing from this test", s.YAML)
		}
	}
}

func TestStrictSection(t *testing.T) {
	_, err := load(t, nil, nil, "gymtrace:\n  span_group: all\n")
	wantErr(t, err, `unknown setting "span_group"`, "gym.yaml:2", "known settings: span_groups, pid")
	_, err = load(t, nil, nil, "gymtrace:\n  config: other.yaml\n")
	wantErr(t, err, "cannot name another")
	_, err = load(t, nil, nil, "gymtrace:\n  exporter: [otlp]\n")
	wantErr(t, err, "gymtrace.exporter", "single value")
	_, err = load(t, nil, nil, "gymtrace: [1]\n")
	wantErr(t, err, "mapping")
	_, err = load(t, nil, nil, "gymtrace:\n  inject: true\n  inject: false\n")
	wantErr(t, err, "gym.yaml")
	// Unknown keys elsewhere in a Gym config are not gymtrace's business.
	mustLoad(t, nil, nil, "some_server:\n  anything: 1\ntelemetry:\n  traces_enabled: true\n")
	mustLoad(t, nil, nil, "# just a comment\n")
}

func TestBadFile(t *testing.T) {
	_, err := load(t, nil, nil, "gymtrace:\n  span_groups: [unclosed\n")
	wantErr(t, err, "not valid YAML", "gym.yaml")
	_, err = load(t, nil, nil, "- a\n- b\n")
	wantErr(t, err, "top level must be a mapping")
	_, err = load(t, []string{"--config", "/nonexistent/gym.yaml"}, nil, "")
	wantErr(t, err, "reading config file", "/nonexistent/gym.yaml", "--config")
	c := mustLoad(t, nil, map[string]string{"GYMTRACE_CONFIG": ""}, "")
	if c.ConfigPath != "" {
		t.Error("empty GYMTRACE_CONFIG is not given")
	}
}

func TestConfigFromEnv(t *testing.T) {
	p := filepath.Join(t.TempDir(), "g.yaml")
	os.WriteFile(p, []byte("gymtrace:\n  span_groups: all\n"), 0o644)
	c := mustLoad(t, nil, map[string]string{"GYMTRACE_CONFIG": p}, "")
	if c.Mask != groups.AllMask || c.ConfigPath != p {
		t.Errorf("GYMTRACE_CONFIG: %v", c.Mask.Names())
	}
}

func TestGenAIFromEnv(t *testing.T) {
	if c := mustLoad(t, nil, nil, ""); !c.GenAI {
		t.Error("--genai is on by default")
	}
	if c := mustLoad(t, nil, map[string]string{"GYMTRACE_GENAI": "false"}, ""); c.GenAI {
		t.Error("GYMTRACE_GENAI=false left it on")
	}
}

func TestPIDs(t *testing.T) {
	c := mustLoad(t, []string{"--pid", "123,456=agent", "--pid", "789=collector"}, nil, "")
	want := []PIDRole{{123, 0}, {456, 1}, {789, 4}}
	if !reflect.DeepEqual(c.PIDs, want) {
		t.Errorf("pids %v", c.PIDs)
	}
	if c.Discover {
		t.Error("--pid without --discover must turn discovery off")
	}
	c = mustLoad(t, []string{"--pid", "1=resources_servers", "--discover"}, nil, "")
	if !c.Discover || c.PIDs[0].Role != 3 {
		t.Errorf("pid + discover: %+v", c)
	}
	c = mustLoad(t, nil, map[string]string{"GYMTRACE_PID": "42=model"}, "")
	if len(c.PIDs) != 1 || c.PIDs[0] != (PIDRole{42, 2}) {
		t.Errorf("env pid %v", c.PIDs)
	}
	// A flag replaces the env's list rather than adding to it.
	c = mustLoad(t, []string{"--pid", "7"}, map[string]string{"GYMTRACE_PID": "42=model"}, "")
	if !reflect.DeepEqual(c.PIDs, []PIDRole{{7, 0}}) {
		t.Errorf("flag over env pid %v", c.PIDs)
	}
	for arg, msg := range map[string]string{
		"abc":       "bad pid \"abc\"",
		"-5":        "bad pid",
		"0":         "bad pid",
		"12=agents": `unknown role "agents"`,
		"12,12":     "given twice",
		"12=":       "unknown role",
	} {
		_, err := load(t, []string{"--pid", arg}, nil, "")
		wantErr(t, err, "flag --pid", msg)
	}
	_, err := load(t, []string{"--discover=false"}, nil, "")
	wantErr(t, err, "nothing to trace")
}

func TestOTelEnv(t *testing.T) {
	env := map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://generic:4317",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317",
		"OTEL_EXPORTER_OTLP_HEADERS":         "api-key=a%2Cb,x=y",
		"OTEL_EXPORTER_OTLP_TIMEOUT":         "2500",
		"OTEL_TRACES_SAMPLER":                "parentbased_traceidratio",
		"OTEL_TRACES_SAMPLER_ARG":            "0.1",
	}
	c := mustLoad(t, nil, env, "telemetry:\n  otlp_endpoint: http://file:4317\n")
	if c.OTLPEndpoint != "http://traces:4317" || c.Exporter != "otlp" || !c.OTLPInsecure {
		t.Errorf("endpoint %q exporter %q", c.OTLPEndpoint, c.Exporter)
	}
	if !reflect.DeepEqual(c.OTLPHeaders, map[string]string{"api-key": "a,b", "x": "y"}) {
		t.Errorf("headers %v", c.OTLPHeaders)
	}
	if c.OTLPTimeout != 2500*time.Millisecond || c.SampleRatio != 0.1 {
		t.Errorf("timeout %v ratio %v", c.OTLPTimeout, c.SampleRatio)
	}
	// GYMTRACE_ beats OTEL_, flags beat both.
	env["GYMTRACE_OTLP_ENDPOINT"] = "gt:4317"
	env["GYMTRACE_SAMPLE_RATIO"] = "0.5"
	c = mustLoad(t, []string{"--sample-ratio", "0.75"}, env, "")
	if c.OTLPEndpoint != "gt:4317" || c.SampleRatio != 0.75 {
		t.Errorf("precedence: %q %v", c.OTLPEndpoint, c.SampleRatio)
	}
	for sampler, ratio := range map[string]float64{"always_on": 1, "always_off": 0, "parentbased_always_off": 0, "traceidratio": 1} {
		c := mustLoad(t, nil, map[string]string{"OTEL_TRACES_SAMPLER": sampler}, "")
		if c.SampleRatio != ratio {
			t.Errorf("%s: ratio %v, want %v", sampler, c.SampleRatio, ratio)
		}
	}
	_, err := load(t, nil, map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "")
	wantErr(t, err, "OTEL_TRACES_SAMPLER_ARG", "from 0 to 1")
	_, err = load(t, nil, map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, "")
	wantErr(t, err, "OTEL_EXPORTER_OTLP_TIMEOUT", "milliseconds")
	// An unknown sampler is a warning, not a failure; empty OTEL vars are unset.
	c = mustLoad(t, nil, map[string]string{"OTEL_TRACES_SAMPLER": "xray", "OTEL_EXPORTER_OTLP_ENDPOINT": ""}, "")
	if c.SampleRatio != 1 || c.Exporter != "tree" {
		t.Errorf("%+v", c)
	}
}

func TestBadValues(t *testing.T) {
	cases := []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{[]string{"--sample-ratio", "1.5"}, nil, []string{"flag --sample-ratio", "from 0 to 1"}},
		{[]string{"--sample-ratio", "NaN"}, nil, []string{"from 0 to 1"}},
		{nil, map[string]string{"GYMTRACE_SAMPLE_RATIO": "half"}, []string{"env GYMTRACE_SAMPLE_RATIO"}},
		{[]string{"--ringbuf-bytes", "3000000"}, nil, []string{"power of two"}},
		{[]string{"--ringbuf-bytes", "1KiB"}, nil, []string{"one page"}},
		{[]string{"--ringbuf-bytes", "lots"}, nil, []string{"not a number of bytes"}},
		{[]string{"--exporter", "zipkin"}, nil, []string{"unknown exporter", "otlp, tree or jsonl"}},
		{[]string{"--exporter", "otlp"}, nil, []string{"needs an endpoint", "--otlp-endpoint"}},
		{[]string{"--otlp-endpoint", "ftp://x:1"}, nil, []string{"scheme"}},
		{[]string{"--otlp-endpoint", "http://"}, nil, []string{"not a URL with a host"}},
		{[]string{"--otlp-timeout", "10"}, nil, []string{"with a unit"}},
		{[]string{"--otlp-headers", "novalue"}, nil, []string{"key=value"}},
		{[]string{"--log-level", "loud"}, nil, []string{"unknown log level"}},
		{[]string{"--inject=maybe"}, nil, []string{"not a boolean"}},
		{nil, map[string]string{"GYMTRACE_INJECT": "maybe"}, []string{"env GYMTRACE_INJECT", "not a boolean"}},
		{[]string{"--no-such-flag"}, nil, []string{"no-such-flag", "gymtrace --help"}},
		{[]string{"--output="}, nil, []string{"output must not be empty"}},
		{[]string{"--pressure-interval", "500ms"}, nil, []string{"flag --pressure-interval", "at least 1s"}},
		{[]string{"--pressure-interval", "5"}, nil, []string{"with a unit"}},
		{[]string{"--pressure-interval", "-5s"}, nil, []string{"at least 1s"}},
	}
	for _, c := range cases {
		_, err := load(t, c.args, c.env, "")
		wantErr(t, err, c.want...)
	}
}

func TestSecretsNotInErrors(t *testing.T) {
	_, err := load(t, []string{"--otlp-headers", "authorization=Bearer%zzsecret"}, nil, "")
	wantErr(t, err, "authorization")
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error leaks a header value: %v", err)
	}
}

func TestGoodValues(t *testing.T) {
	c := mustLoad(t, []string{"--ringbuf-bytes", "4096", "--inject=false", "--rollout-ids=0", "--reward=false", "--genai=false", "--log-level", "WARNING",
		"--exporter", "JSONL", "--output", "/tmp/x.jsonl", "--otlp-endpoint", "collector:4317", "--otlp-insecure", "--pressure-interval", "0"}, nil, "")
	if c.RingbufBytes != 4096 || c.PressureInterval != 0 || c.Inject || c.RolloutIDs || c.Reward || c.GenAI || c.LogLevel != "warn" || c.Exporter != "jsonl" ||
		c.Output != "/tmp/x.jsonl" || !c.OTLPInsecure {
		t.Errorf("%+v", c)
	}
	c = mustLoad(t, []string{"run", "extra"}, nil, "")
	if !reflect.DeepEqual(c.Args, []string{"run", "extra"}) {
		t.Errorf("positional args %v", c.Args)
	}
	for in, want := range map[string]int{"8MiB": 8 << 20, "8m": 8 << 20, "1G": 1 << 30, "64KiB": 64 << 10, " 16 MiB ": 16 << 20} {
		if n, err := ParseSize(in); err != nil || n != want {
			t.Errorf("ParseSize(%q) = %d, %v", in, n, err)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		if _, err := load(t, []string{arg}, nil, ""); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s: %v", arg, err)
		}
	}
	var b bytes.Buffer
	if err := WriteFlagHelp(&b); err != nil {
		t.Fatal(err)
	}
	for _, s := range Settings() {
		if !strings.Contains(b.String(), "--"+s.Flag) {
			t.Errorf("help lacks --%s", s.Flag)
		}
	}
}

func TestReload(t *testing.T) {
	p := filepath.Join(t.TempDir(), "g.yaml")
	os.WriteFile(p, []byte("gymtrace:\n  span_groups: default\n"), 0o644)
	l := &Loader{Args: []string{"--config", p, "--log-level", "debug"}, LookupEnv: func(string) (string, bool) { return "", false }}
	c, err := l.Load()
	if err != nil || c.Mask != groups.DefaultMask {
		t.Fatalf("%v %v", c, err)
	}
	os.WriteFile(p, []byte("gymtrace:\n  span_groups: per_rollout,sandbox\n"), 0o644)
	c, err = l.Reload()
	if err != nil || c.Mask != groups.PerRolloutMask.With(groups.Sandbox) || c.LogLevel != "debug" {
		t.Fatalf("reload: %v %v", c, err)
	}
	os.WriteFile(p, []byte("gymtrace:\n  span_groups: nope\n"), 0o644)
	if _, err := l.Reload(); err == nil {
		t.Fatal("a bad file on reload must be an error (the caller keeps the old config)")
	}
}

// TestREADMETable keeps the README's settings table in step with Settings.
func TestREADMETable(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatalf("reading README.md: %v", err)
	}
	readme := string(data)
	for _, s := range Settings() {
		row := "| `--" + s.Flag + "` | `" + s.Env + "` |"
		if !strings.Contains(readme, row) {
			t.Errorf("README settings table lacks a row starting %q", row)
		}
		if s.Flag != "config" && !strings.Contains(readme, "`"+s.YAML+"`") {
			t.Errorf("README lacks the YAML key %s", s.YAML)
		}
	}
}

func TestDebugNotes(t *testing.T) {
	var logs bytes.Buffer
	l := &Loader{
		LookupEnv: func(k string) (string, bool) {
			return map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}[k], k == "OTEL_EXPORTER_OTLP_PROTOCOL"
		},
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	p := filepath.Join(t.TempDir(), "g.yaml")
	os.WriteFile(p, []byte("telemetry:\n  enabled: false\n  otlp_headers: k=topsecret\n"), 0o644)
	l.Args = []string{"--config", p}
	if _, err := l.Load(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, want := range []string{"ignoring telemetry.enabled", "gRPC only"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "topsecret") {
		t.Error("a header value was logged")
	}
}
