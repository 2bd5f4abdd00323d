package config

import (
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Keys of Gym's `telemetry:` block that gymtrace reads, mapped to its own
// settings. Gym's block allows extra keys, so the others are noted and skipped.
var telemetryKeys = map[string]string{
	"span_groups":   "span-groups",
	"otlp_endpoint": "otlp-endpoint",
	"otlp_headers":  "otlp-headers",
}

// parseFile reads a YAML config file. It returns the settings found in the
// `telemetry:` block and in the `gymtrace:` section, keyed by flag name. Other
// top-level keys (a whole Gym config: servers, datasets...) are left alone.
func parseFile(path string, data []byte, lookupEnv func(string) (string, bool), log *slog.Logger) (telemetry, section map[string]value, err error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, nil, fmt.Errorf("config file %s is not valid YAML: %w", path, err)
	}
	telemetry, section = map[string]value{}, map[string]value{}
	if len(doc.Content) == 0 { // empty file
		return telemetry, section, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, nil, fmt.Errorf("config file %s: the top level must be a mapping with a telemetry: block and/or a gymtrace: section", path)
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		key, val := root.Content[i], root.Content[i+1]
		switch key.Value {
		case "telemetry":
			if err := readTelemetry(path, val, lookupEnv, log, telemetry); err != nil {
				return nil, nil, err
			}
		case "gymtrace":
			if err := readSection(path, val, section); err != nil {
				return nil, nil, err
			}
		}
	}
	return telemetry, section, nil
}

func readTelemetry(path string, n *yaml.Node, lookupEnv func(string) (string, bool), log *slog.Logger, out map[string]value) error {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("%s:%d: telemetry must be a mapping, as in Gym's config", path, n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		src := fmt.Sprintf("%s:%d telemetry.%s", path, k.Line, k.Value)
		flagName, read := telemetryKeys[k.Value]
		switch {
		case k.Value == "enabled":
			log.Debug("ignoring telemetry.enabled: gymtrace replaces Gym's in-process telemetry and traces either way", "file", path)
			continue
		case k.Value == "otlp_protocol":
			if p := strings.TrimSpace(v.Value); !isNull(v) && p != "grpc" {
				log.Warn("gymtrace exports OTLP over gRPC only; ignoring telemetry.otlp_protocol", "file", path, "protocol", p)
			}
			continue
		case !read:
			log.Debug("ignoring a telemetry key gymtrace does not use", "file", path, "key", k.Value)
			continue
		}
		if isNull(v) {
			continue // Gym's own default for these keys is null: not given
		}
		if v.Kind != yaml.ScalarNode {
			return fmt.Errorf("%s: must be a single string value", src)
		}
		s, err := expandOmegaConf(v.Value, lookupEnv)
		if err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
		out[flagName] = value{s: s, src: src}
	}
	return nil
}

// readSection reads the `gymtrace:` section strictly: every key must be a
// setting, so a typo fails loudly instead of being ignored.
func readSection(path string, n *yaml.Node, out map[string]value) error {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("%s:%d: gymtrace must be a mapping of settings, e.g. `gymtrace: {span_groups: per_rollout}`", path, n.Line)
	}
	byKey := map[string]*Setting{}
	var known []string
	for i := range settings {
		if settings[i].Flag == "config" {
			continue
		}
		byKey[settings[i].YAML] = &settings[i]
		known = append(known, settings[i].YAML)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		src := fmt.Sprintf("%s:%d gymtrace.%s", path, k.Line, k.Value)
		s, ok := byKey[k.Value]
		if !ok {
			hint := ""
			if k.Value == "config" {
				hint = " (a config file cannot name another; use --config)"
			}
			return fmt.Errorf("%s: unknown setting %q%s; known settings: %s", src, k.Value, hint, strings.Join(known, ", "))
		}
		if _, dup := out[s.Flag]; dup {
			return fmt.Errorf("%s: %q is set twice in the gymtrace section", src, k.Value)
		}
		val, err := nodeValue(s, v)
		if err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
		if val == nil {
			continue
		}
		val.src = src
		out[s.Flag] = *val
	}
	return nil
}

// nodeValue turns a YAML value into a raw setting value: scalars as they are,
// a list for pid or span_groups, a mapping for otlp_headers. A null is "not
// given"; `span_groups: ""` selects no group.
func nodeValue(s *Setting, v *yaml.Node) (*value, error) {
	if isNull(v) {
		return nil, nil
	}
	switch v.Kind {
	case yaml.ScalarNode:
		return &value{s: v.Value}, nil
	case yaml.SequenceNode:
		if s.Flag != "pid" && s.Flag != "span-groups" {
			break
		}
		parts := make([]string, 0, len(v.Content))
		for _, item := range v.Content {
			if item.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: list items must be single values", item.Line)
			}
			parts = append(parts, item.Value)
		}
		return &value{s: strings.Join(parts, ",")}, nil
	case yaml.MappingNode:
		if s.Flag != "otlp-headers" {
			break
		}
		kv := map[string]string{}
		for i := 0; i+1 < len(v.Content); i += 2 {
			hk, hv := v.Content[i], v.Content[i+1]
			if hv.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("header %q: the value must be a string", hk.Value)
			}
			kv[strings.ToLower(hk.Value)] = hv.Value
		}
		return &value{kv: kv}, nil
	}
	what := "a single value"
	switch s.Flag {
	case "pid":
		what = "a PID, a PID=ROLE string or a list of them"
	case "otlp-headers":
		what = "a key=value,... string or a mapping"
	}
	return nil, fmt.Errorf("must be %s", what)
}

func isNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

var interpolation = regexp.MustCompile(`\$\{([^}]*)\}`)

// expandOmegaConf resolves the `${oc.env:NAME}` and `${oc.env:NAME,default}`
// interpolations Gym configs use for secrets (OmegaConf syntax). Other
// interpolations need Gym's whole config tree, which gymtrace does not
// evaluate.
func expandOmegaConf(s string, lookupEnv func(string) (string, bool)) (string, error) {
	var err error
	out := interpolation.ReplaceAllStringFunc(s, func(m string) string {
		inner := strings.TrimSpace(m[2 : len(m)-1])
		rest, ok := strings.CutPrefix(inner, "oc.env:")
		if !ok {
			if err == nil {
				err = fmt.Errorf("gymtrace resolves only ${oc.env:VAR} interpolations, not %s; put the value in the gymtrace: section or pass a flag", m)
			}
			return m
		}
		name, def, hasDef := strings.Cut(rest, ",")
		name = strings.TrimSpace(name)
		if v, ok := lookupEnv(name); ok {
			return v
		}
		if hasDef {
			return strings.Trim(strings.TrimSpace(def), `'"`)
		}
		if err == nil {
			err = fmt.Errorf("%s: environment variable %s is not set; set it or give the value directly", m, name)
		}
		return m
	})
	return out, err
}
