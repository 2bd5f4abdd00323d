package spans

import (
	"math/bits"

	"github.com/gymtrace/gymtrace/internal/groups"
)

// routeInfo is what a server request's method and path mean on a server of a
// given role: the server span's route and, when Gym opens one, the gym.* span.
type routeInfo struct {
	route    string       // http.route: Gym's template for known routes, else the path
	gymSpan  string       // "" when the route has no gym.* span (or it is ambiguous)
	gymGroup groups.Group // valid when gymSpan != ""
	// ambiguous is the union of the gym.* groups this request could belong to
	// while the role is unknown and the roles disagree; 0 otherwise.
	ambiguous groups.Mask
	rolloutID string // from a /ng-rollout/<id> prefix
}

const rolloutTemplate = "/ng-rollout/{rollout_id}"

var knownRoles = [...]groups.Role{groups.RoleAgent, groups.RoleModel, groups.RoleResources, groups.RoleOrchestrator}

func classify(role groups.Role, method, path string) routeInfo {
	rest, id := groups.StripRolloutPrefix(path)
	ri := routeInfo{rolloutID: id}
	if rt, ok := groups.MatchRoute(role, method, path); ok {
		ri.route = rt.Path
		if rt.Span != "" {
			if g, ok := singleGroup(rt.Groups); ok {
				ri.gymSpan, ri.gymGroup = rt.Span, g
			}
		}
		return ri
	}
	switch {
	case id == "":
		ri.route = path
	case role == groups.RoleModel || role == groups.RoleResources:
		// Their middleware strips the prefix before routing.
		ri.route = rest
	default:
		// Keep the id out of the span name: names must not grow with rollouts.
		ri.route = rolloutTemplate + rest
	}
	if role == groups.RoleUnknown {
		for _, r := range knownRoles {
			if rt, ok := groups.MatchRoute(r, method, path); ok {
				ri.ambiguous |= rt.Groups
			}
		}
	}
	return ri
}

// inferRole names the role a process must have from a route only one kind of
// Gym server serves (a process that serves /run is an agent).
func inferRole(method, path string) groups.Role {
	if method != "POST" {
		return groups.RoleUnknown
	}
	rest, id := groups.StripRolloutPrefix(path)
	switch {
	case path == "/run", id != "" && rest == "/training-token-capture/v1/responses":
		return groups.RoleAgent
	case rest == "/v1/chat/completions", rest == "/v1/messages":
		return groups.RoleModel
	case rest == "/verify", rest == "/seed_session":
		return groups.RoleResources
	}
	return groups.RoleUnknown
}

func singleGroup(m groups.Mask) (groups.Group, bool) {
	if bits.OnesCount64(uint64(m)) != 1 {
		return 0, false
	}
	return groups.Group(bits.TrailingZeros64(uint64(m))), true
}
