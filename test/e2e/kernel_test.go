//go:build linux

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestKernelRealSockets drives byte-exact HTTP/1.1 traffic between two traced
// processes (a raw server and a raw client) and checks the spans of both ends.
func TestKernelRealSockets(t *testing.T) {
	k := runKernel(t, "127.0.0.1:0", "server,http_client", kernelScenarios)
	checkNoStraySpans(t, k, kernelScenarios, nil)
	if v := k.metrics["gymtrace_ringbuf_reserve_failures_total"]; v != 0 {
		t.Errorf("%v records lost in the kernel (ring buffer full or crowded)", v)
	}
	t.Logf("%d spans; kernel counters %v", len(k.spans.all), kernelCounters(k.metrics))
}

// TestKernelJoinRace: 2000 small requests, each one write, on one keep-alive
// connection between two traced processes. Every SERVER span's parent must be
// the CLIENT span that sent it, whichever CPU's record (and timestamp) comes
// first: the receiver's read can return before the sender's write does.
func TestKernelJoinRace(t *testing.T) {
	k := runKernel(t, "127.0.0.1:0", "server,http_client", []scenario{joinRaceScenario})
	// The connection is new: both of its ends are followed from their first
	// byte, so the pairing is by order, not by timestamps (loader.FlagFresh).
	if v := k.metrics[`gymtrace_kernel_events_total{reason="fresh_conns"}`]; v < 2 {
		t.Errorf("fresh_conns = %v, want at least the 2 ends of the new connection", v)
	}
}

const joinRaceN = 2000

var joinRaceScenario = scenario{
	name: "joinrace",
	drive: func(addr string) (map[string]string, error) {
		return oneConn(addr, func(c *rawClient) (map[string]string, error) {
			for i := 0; i < joinRaceN; i++ {
				if err := c.expect("GET", fmt.Sprintf("/joinrace/%d/echo", i), nil, "", 200); err != nil {
					return nil, err
				}
			}
			return nil, nil
		})
	},
	check: func(t *testing.T, k *kernelRun, _ map[string]string) {
		clients := map[string]Span{}
		for _, s := range k.spans.all {
			if s.Kind == "CLIENT" {
				clients[s.Path()] = s
			}
		}
		var unjoined []string
		servers := 0
		for _, s := range k.spans.all {
			if s.Kind != "SERVER" {
				continue
			}
			servers++
			c, ok := clients[s.Path()]
			if !ok || s.Parent != c.SpanID {
				parent := "none"
				if p, ok := k.spans.parent(s); ok {
					parent = "the client span of " + p.Path()
				}
				unjoined = append(unjoined, fmt.Sprintf("%s (server span starts %v after its client span; parent: %s)", s.Path(),
					time.Duration(int64(s.Start)-int64(c.Start)), parent))
			}
		}
		if servers != joinRaceN || len(clients) != joinRaceN {
			t.Errorf("%d SERVER and %d CLIENT spans for %d requests", servers, len(clients), joinRaceN)
		}
		if len(unjoined) > 0 {
			t.Errorf("%d of %d server spans not joined to the client span that sent them: %s", len(unjoined), joinRaceN,
				strings.Join(unjoined[:min(len(unjoined), 10)], "; "))
		}
	},
}

// TestKernelIPv6 plays a few of the scenarios over ::1.
func TestKernelIPv6(t *testing.T) {
	var list []scenario
	for _, s := range kernelScenarios {
		switch s.name {
		case "split", "keepalive", "tpsecondread", "pipelined", "head", "bigresponse":
			list = append(list, s)
		}
	}
	k := runKernel(t, "[::1]:0", "server,http_client", list)
	if k.host != "::1" {
		t.Fatalf("listening on %s", k.addr)
	}
	checkNoStraySpans(t, k, list, nil)
}
