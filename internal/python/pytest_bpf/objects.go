package pytestbpf

// Objects is the loaded test object.
type Objects = pytestObjects

// Event is one send as the test programs saw it.
type Event = pytestPytestEvent

// Spawner is a gt_py_spawners value (struct gt_py_spawner).
type Spawner = pytestGtPySpawner

// Load loads the test object into the kernel.
func Load() (*Objects, error) {
	var o Objects
	if err := loadPytestObjects(&o, nil); err != nil {
		return nil, err
	}
	return &o, nil
}

// LoadSpec returns the object's spec (for BTF layout checks).
var LoadSpec = loadPytest
