//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// pyRoot is a Debian root with a Python and the web stack, run under chroot.
type pyRoot struct {
	suite, env, dflt, python string
	loop, http               string // the stack's --loop and --http there
}

var pyRoots = map[string]pyRoot{
	runtimeGym:        {suite: "trixie", env: "GYMTRACE_TRIXIE_ROOT", dflt: "/var/tmp/gymtrace-trixie", python: "/usr/bin/python3.13", loop: "uvloop", http: "httptools"},
	runtimeSid:        {suite: "sid", env: "GYMTRACE_SID_ROOT", dflt: "/var/tmp/gymtrace-sid", python: "/usr/bin/python3.14", loop: "uvloop", http: "httptools"},
	runtimeSidAsyncio: {suite: "sid", env: "GYMTRACE_SID_ROOT", dflt: "/var/tmp/gymtrace-sid", python: "/usr/bin/python3.14", loop: "asyncio", http: "httptools"},
}

func (r pyRoot) dir() string {
	if d := os.Getenv(r.env); d != "" {
		return d
	}
	return r.dflt
}

// missing says why the root cannot run the stack, "" when it can.
func (r pyRoot) missing() string {
	root := r.dir()
	py := filepath.Base(r.python)
	if _, err := os.Stat(filepath.Join(root, r.python)); err != nil {
		return fmt.Sprintf("no Debian %s root with %s at %s: run test/python/make-root.sh %s (scripts/setup --tests does)", r.suite, py, root, r.suite)
	}
	if out, err := exec.Command("chroot", root, r.python, "-c", "import uvloop, httptools, fastapi, aiohttp, yaml").CombinedOutput(); err != nil {
		return fmt.Sprintf("the Debian %s root at %s lacks uvloop/httptools/fastapi/aiohttp/yaml: %v %s", r.suite, root, err, tail(string(out), 200))
	}
	return ""
}

// gymTelMissing says why the root cannot run Gym's own telemetry.
func (r pyRoot) gymTelMissing() string {
	root := r.dir()
	if out, err := exec.Command("chroot", root, r.python, "-c",
		"import opentelemetry.sdk.trace, opentelemetry.sdk.metrics, opentelemetry.exporter.otlp.proto.http.trace_exporter").CombinedOutput(); err != nil {
		return fmt.Sprintf("the Debian %s root at %s lacks the OTel Python SDK (%s): install the Debian packages "+
			"python3-opentelemetry-sdk and python3-opentelemetry-exporter-otlp-proto-http into it "+
			"(rm -rf %s && test/python/make-root.sh %s; scripts/setup --tests builds it with them)",
			r.suite, root, tail(string(out), 160), root, r.suite)
	}
	return ""
}

// gymRuntimeMissing says why the Gym-runtime rows cannot run, "" when they can.
func gymRuntimeMissing() string { return pyRoots[runtimeGym].missing() }

// skipReasons says, per row, why it cannot run here (rows not named run).
// sink is the OTLP sink binary the OTLP rows export to, "" none.
func skipReasons(configs []wlConfig, sink string) map[string]string {
	memo := map[string]string{}
	check := func(key string, f func() string) string {
		if w, ok := memo[key]; ok {
			return w
		}
		memo[key] = f()
		return memo[key]
	}
	out := map[string]string{}
	for _, c := range configs {
		r, chrooted := pyRoots[c.Runtime]
		why := ""
		if chrooted {
			why = check(r.suite+r.python, r.missing)
		}
		if why == "" && c.GymTel != "" {
			if !chrooted {
				why = "Gym's own telemetry runs only on a Debian root that packages the OTel SDK"
			} else {
				why = check("otel:"+r.suite, r.gymTelMissing)
			}
		}
		if why == "" && c.GymTel == "otlp" && sink == "" {
			why = "no OTLP sink for the OTLP exporter: pass --otlpsink (scripts/bench builds test/otlpsink)"
		}
		if why != "" {
			out[c.Name] = why
		}
	}
	return out
}
