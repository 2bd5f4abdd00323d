package groups

import (
	"fmt"
	"strings"
)

// Role is a Gym server type. The numbers are those of enum gt_role in
// bpf/common/contract.h (and internal/loader's Role* constants); this package
// keeps its own type so it does not depend on the loader.
type Role uint8

// Roles.
const (
	RoleUnknown      Role = 0
	RoleAgent        Role = 1 // responses_api_agents
	RoleModel        Role = 2 // responses_api_models
	RoleResources    Role = 3 // resources_servers
	RoleOrchestrator Role = 4 // the rollout collector / head server

	// RoleCount bounds the known roles (gt_config.server_possible has room
	// for GT_MAX_ROLES = 8).
	RoleCount = 5
)

var roleNames = [RoleCount]struct{ serverType, short string }{
	{"unknown", "unknown"},
	{"responses_api_agents", "agent"},
	{"responses_api_models", "model"},
	{"resources_servers", "resources"},
	{"orchestrator", "orchestrator"},
}

// ServerType is Gym's name for the role, the value of the
// nemo.gym.server.type resource attribute ("" for RoleUnknown).
func (r Role) ServerType() string {
	if r == RoleUnknown || int(r) >= RoleCount {
		return ""
	}
	return roleNames[r].serverType
}

// String is the short name: agent, model, resources, orchestrator, unknown.
func (r Role) String() string {
	if int(r) >= RoleCount {
		return fmt.Sprintf("role(%d)", uint8(r))
	}
	return roleNames[r].short
}

// ParseRole accepts Gym's server type names and gymtrace's short names,
// case-insensitively: responses_api_agents|agent,
// responses_api_models|model, resources_servers|resources,
// orchestrator|collector.
func ParseRole(s string) (Role, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "responses_api_agents", "agent":
		return RoleAgent, nil
	case "responses_api_models", "model":
		return RoleModel, nil
	case "resources_servers", "resources":
		return RoleResources, nil
	case "orchestrator", "collector":
		return RoleOrchestrator, nil
	}
	return RoleUnknown, fmt.Errorf("unknown role %q; valid roles: agent (responses_api_agents), model (responses_api_models), resources (resources_servers), orchestrator (collector)", s)
}

// Route is one HTTP route a Gym server of a given role serves.
type Route struct {
	Role   Role
	Method string // "GET", "POST"
	// Path is the route template as Gym's FastAPI app declares it, e.g.
	// "/ng-rollout/{rollout_id}/v1/responses". The server span is named
	// "<Method> <Path>".
	Path string
	// Span is the gym.* span Gym's telemetry opens inside the handler, ""
	// when the route has only its server span.
	Span string
	// Groups is the group of Span (0 when Span is ""): the route bits the
	// kernel route table holds. The server span itself is always in Server.
	Groups Mask
}

// RolloutPrefix is the path prefix that carries a rollout id: agents route
// it, model and resources servers strip it in a middleware.
const RolloutPrefix = "/ng-rollout/"

// KernelPath is the route table key's path: Path with a leading
// "/ng-rollout/{rollout_id}" removed, since the kernel cannot match templates.
func (r Route) KernelPath() string {
	p, _ := StripRolloutPrefix(r.Path)
	return p
}

// ServerSpanName is the name of the route's server span, "POST /verify".
func (r Route) ServerSpanName() string { return r.Method + " " + r.Path }

var routes = []Route{
	// Agent (responses_api_agents).
	{RoleAgent, "POST", "/run", "gym.rollout", Rollout.Mask()},
	{RoleAgent, "POST", "/v1/responses", "gym.agent.responses", Agent.Mask()},
	{RoleAgent, "POST", "/ng-rollout/{rollout_id}/v1/responses", "gym.agent.responses", Agent.Mask()},
	{RoleAgent, "POST", "/ng-rollout/{rollout_id}/training-token-capture/v1/responses", "gym.agent.responses", Agent.Mask()},
	{RoleAgent, "POST", "/aggregate_metrics", "", 0},
	{RoleAgent, "GET", "/", "", 0},
	// Model (responses_api_models). A middleware strips /ng-rollout/<id>
	// before routing, so the templates carry no prefix.
	{RoleModel, "POST", "/v1/chat/completions", "gym.model.chat_completions", ModelCall.Mask()},
	{RoleModel, "POST", "/v1/responses", "gym.model.responses", ModelCall.Mask()},
	{RoleModel, "POST", "/v1/messages", "gym.model.messages", ModelCall.Mask()},
	// Resources (resources_servers). Tool routes (POST /<tool_name>) are
	// per server and not listed: they get only a server span.
	{RoleResources, "POST", "/seed_session", "", 0},
	{RoleResources, "POST", "/verify", "gym.verify", Verify.Mask()},
	{RoleResources, "POST", "/aggregate_metrics", "", 0},
	{RoleResources, "GET", "/reverify_mode", "", 0},
	// Orchestrator (head server).
	{RoleOrchestrator, "GET", "/", "", 0},
	{RoleOrchestrator, "GET", "/global_config_dict_yaml", "", 0},
	{RoleOrchestrator, "GET", "/server_instances", "", 0},
}

// Routes returns the known routes of a role; RoleUnknown returns every
// role's routes. The slice is a copy.
func Routes(r Role) []Route {
	var out []Route
	for _, rt := range routes {
		if r == RoleUnknown || rt.Role == r {
			out = append(out, rt)
		}
	}
	return out
}

// GymRoutes returns the routes that carry a gym.* span: the entries of the
// kernel route table.
func GymRoutes() []Route {
	var out []Route
	for _, rt := range routes {
		if rt.Span != "" {
			out = append(out, rt)
		}
	}
	return out
}

// StripRolloutPrefix removes a leading "/ng-rollout/<id>" from a request path
// and returns the rest ("/" at least) and the id. A path without the prefix
// comes back unchanged with an empty id.
func StripRolloutPrefix(path string) (rest, rolloutID string) {
	if !strings.HasPrefix(path, RolloutPrefix) {
		return path, ""
	}
	tail := path[len(RolloutPrefix):]
	i := strings.IndexByte(tail, '/')
	if i < 0 {
		return "/", tail
	}
	return tail[i:], tail[:i]
}

// MatchRoute finds the route a concrete request path hits on a server of the
// given role; the query string, if any, is ignored. For RoleUnknown it answers
// only when every role that knows the path agrees on its gym span.
func MatchRoute(r Role, method, path string) (Route, bool) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	key, _ := StripRolloutPrefix(path)
	prefixed := strings.HasPrefix(path, RolloutPrefix)
	var found Route
	n := 0
	for _, rt := range routes {
		if (r != RoleUnknown && rt.Role != r) || rt.Method != method {
			continue
		}
		var ok bool
		switch tmplPrefixed := strings.HasPrefix(rt.Path, RolloutPrefix); {
		case !prefixed:
			ok = !tmplPrefixed && rt.Path == path
		case tmplPrefixed:
			ok = rt.KernelPath() == key
		default:
			// Model and resources servers strip the prefix before
			// routing; agents route it explicitly.
			ok = rt.Role != RoleAgent && rt.Path == key
		}
		if !ok {
			continue
		}
		if n > 0 && (found.Span != rt.Span || found.Groups != rt.Groups) {
			return Route{}, false
		}
		if n == 0 {
			found = rt
		}
		n++
	}
	return found, n > 0
}

// ServerPossible is every group an inbound request to a server of role r can
// belong to: server plus the groups of that role's gym routes; for RoleUnknown
// the union over all roles. It fills gt_config.server_possible so the kernel
// reads no byte of a message none of whose groups is enabled.
func ServerPossible(r Role) Mask {
	m := Server.Mask()
	for _, rt := range routes {
		if r == RoleUnknown || rt.Role == r {
			m |= rt.Groups
		}
	}
	return m
}

// ClientPossible is every group an outbound request can belong to.
func ClientPossible() Mask { return HTTPClient.Mask() }
