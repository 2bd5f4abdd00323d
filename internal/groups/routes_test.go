package groups

import (
	"reflect"
	"testing"
)

func TestParseRole(t *testing.T) {
	for in, want := range map[string]Role{
		"responses_api_agents": RoleAgent, "agent": RoleAgent, "Agent": RoleAgent,
		"responses_api_models": RoleModel, "model": RoleModel,
		"resources_servers": RoleResources, "resources": RoleResources,
		"orchestrator": RoleOrchestrator, "collector": RoleOrchestrator,
	} {
		got, err := ParseRole(in)
		if err != nil || got != want {
			t.Errorf("ParseRole(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseRole("agents"); err == nil {
		t.Error("ParseRole(agents) accepted")
	}
	// The numbers are enum gt_role's.
	if RoleAgent != 1 || RoleModel != 2 || RoleResources != 3 || RoleOrchestrator != 4 {
		t.Error("role numbers drifted from bpf/common/contract.h")
	}
	if RoleModel.ServerType() != "responses_api_models" || RoleUnknown.ServerType() != "" {
		t.Error("ServerType")
	}
}

func TestStripRolloutPrefix(t *testing.T) {
	for in, want := range map[string][2]string{
		"/ng-rollout/3-0/v1/responses":                           {"/v1/responses", "3-0"},
		"/ng-rollout/3-0-a1/training-token-capture/v1/responses": {"/training-token-capture/v1/responses", "3-0-a1"},
		"/ng-rollout/abc":                                        {"/", "abc"},
		"/v1/responses":                                          {"/v1/responses", ""},
		"/ng-rolloutx/v1":                                        {"/ng-rolloutx/v1", ""},
	} {
		rest, id := StripRolloutPrefix(in)
		if rest != want[0] || id != want[1] {
			t.Errorf("StripRolloutPrefix(%q) = %q, %q; want %q", in, rest, id, want)
		}
	}
}

func TestMatchRoute(t *testing.T) {
	cases := []struct {
		role         Role
		method, path string
		span         string
		ok           bool
	}{
		{RoleAgent, "POST", "/run", "gym.rollout", true},
		{RoleAgent, "POST", "/v1/responses", "gym.agent.responses", true},
		{RoleAgent, "POST", "/ng-rollout/7-2/v1/responses", "gym.agent.responses", true},
		{RoleAgent, "POST", "/ng-rollout/7-2/training-token-capture/v1/responses", "gym.agent.responses", true},
		{RoleAgent, "GET", "/run", "", false},
		{RoleModel, "POST", "/v1/chat/completions?x=1", "gym.model.chat_completions", true},
		{RoleModel, "POST", "/ng-rollout/7-2/v1/responses", "gym.model.responses", true},
		{RoleModel, "POST", "/ng-rollout/7-2/v1/messages", "gym.model.messages", true},
		{RoleResources, "POST", "/verify", "gym.verify", true},
		{RoleResources, "POST", "/ng-rollout/1-1/verify", "gym.verify", true},
		{RoleResources, "POST", "/seed_session", "", true},
		{RoleResources, "POST", "/get_weather", "", false},
		{RoleOrchestrator, "GET", "/server_instances", "", true},
		{RoleUnknown, "POST", "/verify", "gym.verify", true},
		{RoleUnknown, "POST", "/run", "gym.rollout", true},
		// Agent and model both serve /v1/responses with different spans.
		{RoleUnknown, "POST", "/v1/responses", "", false},
		// Agents route the prefix themselves: /ng-rollout/<id>/run is not /run.
		{RoleAgent, "POST", "/ng-rollout/1-1/run", "", false},
	}
	for _, c := range cases {
		rt, ok := MatchRoute(c.role, c.method, c.path)
		if ok != c.ok || rt.Span != c.span {
			t.Errorf("MatchRoute(%v, %s %s) = %+v, %v; want span %q, %v", c.role, c.method, c.path, rt, ok, c.span, c.ok)
		}
		if ok && rt.Span != "" {
			if g, found := ByName(groupOfSpan(t, rt.Span)); !found || rt.Groups != g.Mask() {
				t.Errorf("%s: groups %v do not match span %s", c.path, rt.Groups.Names(), rt.Span)
			}
		}
	}
}

// groupOfSpan finds the group whose table entry lists span.
func groupOfSpan(t *testing.T, span string) string {
	t.Helper()
	for _, in := range All() {
		for _, s := range in.Spans {
			if s == span {
				return in.Name
			}
		}
	}
	t.Fatalf("span %s is in no group", span)
	return ""
}

func TestRouteTable(t *testing.T) {
	for _, rt := range GymRoutes() {
		if rt.Groups.Len() != 1 || rt.Groups.Has(Server) {
			t.Errorf("%s: gym route groups %v", rt.ServerSpanName(), rt.Groups.Names())
		}
		if len(rt.KernelPath()) > 59 { // GT_ROUTE_PATH_MAX - 1
			t.Errorf("%s: kernel path too long for gt_route_key", rt.Path)
		}
	}
	r := Routes(RoleAgent)[2]
	if r.Path != "/ng-rollout/{rollout_id}/v1/responses" || r.KernelPath() != "/v1/responses" ||
		r.ServerSpanName() != "POST /ng-rollout/{rollout_id}/v1/responses" {
		t.Errorf("agent route: %+v %q", r, r.KernelPath())
	}
	if len(Routes(RoleUnknown)) != len(routes) {
		t.Error("Routes(RoleUnknown) must list every role's routes")
	}
}

func TestPossible(t *testing.T) {
	for r, want := range map[Role][]string{
		RoleAgent:        {"agent", "rollout", "server"},
		RoleModel:        {"model_call", "server"},
		RoleResources:    {"server", "verify"},
		RoleOrchestrator: {"server"},
		RoleUnknown:      {"agent", "model_call", "rollout", "server", "verify"},
	} {
		if got := ServerPossible(r).Names(); !reflect.DeepEqual(got, want) {
			t.Errorf("ServerPossible(%v) = %q, want %q", r, got, want)
		}
	}
	if ClientPossible() != HTTPClient.Mask() {
		t.Error("ClientPossible")
	}
	// The gate effect: with "default" a model server's inbound messages are
	// still read (server), with "verify" alone they are not.
	if !ServerPossible(RoleModel).Any(DefaultMask) || ServerPossible(RoleModel).Any(Verify.Mask()) {
		t.Error("possible-mask gate")
	}
}
