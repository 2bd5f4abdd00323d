package pytestbpf

import "github.com/gymtrace/gymtrace/internal/probesite"

// Objects is the loaded test object.
type Objects = pytestObjects

// Event is one send as the test programs saw it.
type Event = pytestPytestEvent

// Spawner is a gt_py_spawners value (struct gt_py_spawner).
type Spawner = pytestGtPySpawner

// Load loads the test object into the kernel, its uprobe programs typed as
// gymtrace types its own (internal/loader), so the tests attach the way it
// does.
func Load() (*Objects, error) {
	spec, err := loadPytest()
	if err != nil {
		return nil, err
	}
	probesite.PrepareMulti(spec)
	var o Objects
	if err := spec.LoadAndAssign(&o, nil); err != nil {
		return nil, err
	}
	return &o, nil
}

// LoadSpec returns the object's spec (for BTF layout checks).
var LoadSpec = loadPytest
