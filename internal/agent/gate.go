//go:build linux

package agent

import (
	"os"

	"github.com/gymtrace/gymtrace/internal/config"
	"github.com/gymtrace/gymtrace/internal/groups"
	"github.com/gymtrace/gymtrace/internal/loader"
)

// applyMask writes the gate: the mask and, per role, which groups an inbound
// or outbound message could belong to at all, with gateFlags.
func (t *agent) applyMask(c *config.Config) error {
	var sp [8]uint64
	for r := range sp {
		sp[r] = uint64(groups.ServerPossible(groups.Role(r)))
	}
	return t.kern.SetGate(uint64(c.Mask), sp, uint64(groups.ClientPossible()), gateFlags(c))
}

// gateFlags says which body values the kernel reads: rollout ids from /run
// requests (--rollout-ids), the reward from /verify responses (--reward),
// each only while its group (rollout, verify) is enabled in the mask, and
// model names and token counts from model exchanges (--genai, while
// model_call or rollout is); and
// whether requests their caller did not sample are copied out anyway, for
// Gym's metrics (exported over OTLP or on --metrics-addr).
func gateFlags(c *config.Config) uint32 {
	var flags uint32
	if c.RolloutIDs {
		flags |= loader.CfgRolloutIDs
	}
	if c.Reward {
		flags |= loader.CfgReward
	}
	if c.GenAI {
		flags |= loader.CfgGenAI
	}
	if c.GymMetrics && (c.Exporter == config.ExporterOTLP || c.MetricsAddr != "") {
		flags |= loader.CfgKeepUnsampled
	}
	// Benchmarks only (scripts/bench): copy every message out and let the
	// builder filter, to measure what the in-kernel gate saves.
	if os.Getenv("GYMTRACE_BENCH_NO_GATE") == "1" {
		flags |= loader.CfgNoGate
	}
	return flags
}

// routeTable is the kernel's (role, method, path) -> gym.* group table, from
// Gym's routes. Keys hold paths with any /ng-rollout/<id> prefix removed, as
// the kernel looks them up; role 0 (not yet known) gets the union over roles.
func routeTable() map[loader.RouteKey]uint64 {
	out := map[loader.RouteKey]uint64{}
	for _, r := range groups.GymRoutes() {
		path, _ := groups.StripRolloutPrefix(r.Path)
		m := methodCode(r.Method)
		out[loader.NewRouteKey(uint8(r.Role), m, path)] |= uint64(r.Groups)
		out[loader.NewRouteKey(loader.RoleUnknown, m, path)] |= uint64(r.Groups)
	}
	return out
}

func methodCode(m string) uint8 {
	switch m {
	case "GET":
		return loader.MethodGET
	case "POST":
		return loader.MethodPOST
	case "PUT":
		return loader.MethodPUT
	case "DELETE":
		return loader.MethodDELETE
	case "PATCH":
		return loader.MethodPATCH
	case "HEAD":
		return loader.MethodHEAD
	case "OPTIONS":
		return loader.MethodOPTIONS
	}
	return loader.MethodUnknown
}
