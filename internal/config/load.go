package config

import (
	"fmt"
	"io"
	"log/slog"
	"os"
)

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
