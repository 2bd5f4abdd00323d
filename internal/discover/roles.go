package discover

// Role values mirror internal/loader's RoleUnknown..RoleOrchestrator (generated
// from bpf/common/contract.h). They are repeated here so that discovery builds
// and tests without the BPF loader; roles_linux_test.go proves the two agree.
const (
	RoleUnknown      uint8 = 0
	RoleAgent        uint8 = 1
	RoleModel        uint8 = 2
	RoleResources    uint8 = 3
	RoleOrchestrator uint8 = 4
)

// Gym's server type keys, as they appear in a server's config block and as the
// value of the nemo.gym.server.type resource attribute.
const (
	TypeAgents       = "responses_api_agents"
	TypeModels       = "responses_api_models"
	TypeResources    = "resources_servers"
	TypeOrchestrator = "orchestrator"
)

// RoleForType maps a Gym server type key to its role; unknown keys give RoleUnknown.
func RoleForType(typ string) uint8 {
	switch typ {
	case TypeAgents:
		return RoleAgent
	case TypeModels:
		return RoleModel
	case TypeResources:
		return RoleResources
	case TypeOrchestrator:
		return RoleOrchestrator
	}
	return RoleUnknown
}

// TypeForRole is the inverse of RoleForType; RoleUnknown gives "".
func TypeForRole(role uint8) string {
	switch role {
	case RoleAgent:
		return TypeAgents
	case RoleModel:
		return TypeModels
	case RoleResources:
		return TypeResources
	case RoleOrchestrator:
		return TypeOrchestrator
	}
	return ""
}

// ServerType is the nemo.gym.server.type resource attribute ("" when unknown).
func (p *Process) ServerType() string { return TypeForRole(p.Role) }

// ServiceName is the service.name resource attribute Gym's own telemetry uses:
// "nemo-gym/<server name>", the collector being "nemo-gym/orchestrator".
func (p *Process) ServiceName() string {
	if p.Role == RoleOrchestrator && p.ServerName == "" {
		return "nemo-gym/orchestrator"
	}
	if p.ServerName == "" {
		if p.Comm != "" {
			return "nemo-gym/" + p.Comm
		}
		return "nemo-gym/unknown"
	}
	return "nemo-gym/" + p.ServerName
}
