//go:build linux

package discover

import (
	"testing"

	"github.com/gymtrace/gymtrace/internal/loader"
)

// The role numbers are the kernel contract's; discovery repeats them so it can
// build without the loader.
func TestRolesMatchContract(t *testing.T) {
	pairs := []struct{ ours, contract uint8 }{
		{RoleUnknown, loader.RoleUnknown},
		{RoleAgent, loader.RoleAgent},
		{RoleModel, loader.RoleModel},
		{RoleResources, loader.RoleResources},
		{RoleOrchestrator, loader.RoleOrchestrator},
	}
	for _, p := range pairs {
		if p.ours != p.contract {
			t.Errorf("discover role %d != loader role %d", p.ours, p.contract)
		}
	}
}
