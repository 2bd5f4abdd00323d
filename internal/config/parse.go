package config

import (
	"fmt"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/gymtrace/gymtrace/internal/groups"
)

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
