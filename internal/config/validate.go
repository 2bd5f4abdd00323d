package config

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/gymtrace/gymtrace/internal/groups"
)

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
