//go:build linux

package export

import (
	"testing"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// The role numbers written out in resource.go must match the contract.
func TestRoleNumbersMatchTheContract(t *testing.T) {
	for _, c := range []struct {
		mine, contract uint8
		name           string
	}{
		{roleUnknown, loader.RoleUnknown, "unknown"},
		{roleAgent, loader.RoleAgent, "agent"},
		{roleModel, loader.RoleModel, "model"},
		{roleResources, loader.RoleResources, "resources"},
		{roleOrchestrator, loader.RoleOrchestrator, "orchestrator"},
	} {
		if c.mine != c.contract {
			t.Errorf("role %s: export uses %d, contract.h says %d", c.name, c.mine, c.contract)
		}
	}
}
