package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The Vagrantfile is checked with Debian's vagrant (`vagrant validate`); no box
// can be downloaded here, and no provider (VirtualBox, libvirt) is installed,
// so provider blocks are skipped (--ignore-provider). Without vagrant, Ruby's
// syntax check is the fallback.
func TestVagrantfile(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// A copy, so that vagrant's .vagrant/ state stays out of the work tree.
	dir := t.TempDir()
	for _, f := range []string{"Vagrantfile"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vf, _ := os.ReadFile(filepath.Join(dir, "Vagrantfile"))
	for _, want := range []string{"scripts/setup", "scripts/test", "/sys/kernel/btf/vmlinux"} {
		if !strings.Contains(string(vf), want) {
			t.Errorf("the Vagrantfile does not mention %s", want)
		}
	}
	if v, err := exec.LookPath("vagrant"); err == nil {
		cmd := exec.Command(v, "validate", "--ignore-provider")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "VAGRANT_CHECKPOINT_DISABLE=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "validated successfully") {
			t.Fatalf("vagrant validate: %v\n%s", err, out)
		}
		return
	}
	if r, err := exec.LookPath("ruby"); err == nil {
		out, err := exec.Command(r, "-c", filepath.Join(dir, "Vagrantfile")).CombinedOutput()
		if err != nil {
			t.Fatalf("ruby -c Vagrantfile: %v\n%s", err, out)
		}
		t.Log("vagrant is not installed (apt-get install vagrant): checked Ruby syntax only")
		return
	}
	t.Skip("neither vagrant nor ruby is installed: apt-get install vagrant")
}
