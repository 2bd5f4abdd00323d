package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

var arches = []string{"amd64", "arm64"}

// goBuild builds a static binary of pkg (run in dir) for arch.
func goBuild(t *testing.T, dir, pkg, arch, out string) error {
	t.Helper()
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return errors.New(err.Error() + "\n" + string(b))
	}
	return nil
}

// A tiny static program stands in for gymtrace so the builder is tested on its own.
func hello(t *testing.T, arch string) string {
	dir := t.TempDir()
	src := "package main\n\nfunc main() { println(\"hi\") }\n"
	must(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n\ngo 1.22\n"), 0o644))
	out := filepath.Join(dir, "hello-"+arch)
	if err := goBuild(t, dir, ".", arch, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// verifyLayout opens an OCI layout and checks one image per architecture:
// platform, entrypoint, and a single layer with a static binary for that arch.
func verifyLayout(t *testing.T, dir, tag string, want map[string][]byte) v1.Hash {
	t.Helper()
	lp, err := layout.FromPath(dir)
	must(t, err)
	top, err := lp.ImageIndex()
	must(t, err)
	im, err := top.IndexManifest()
	must(t, err)
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != tag {
		t.Fatalf("index.json = %+v, want one index named %s", im.Manifests, tag)
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	must(t, err)
	if mt, _ := idx.MediaType(); mt != types.OCIImageIndex {
		t.Errorf("index media type %s", mt)
	}
	man, err := idx.IndexManifest()
	must(t, err)
	if len(man.Manifests) != len(want) {
		t.Fatalf("%d manifests, want %d", len(man.Manifests), len(want))
	}
	for _, d := range man.Manifests {
		arch := d.Platform.Architecture
		body, ok := want[arch]
		if !ok || d.Platform.OS != "linux" {
			t.Errorf("unexpected platform %+v", d.Platform)
			continue
		}
		img, err := idx.Image(d.Digest)
		must(t, err)
		cf, err := img.ConfigFile()
		must(t, err)
		if cf.Architecture != arch || cf.OS != "linux" || strings.Join(cf.Config.Entrypoint, " ") != Entrypoint || len(cf.Config.Cmd) != 0 {
			t.Errorf("%s config: arch %s os %s entrypoint %q cmd %q", arch, cf.Architecture, cf.OS, cf.Config.Entrypoint, cf.Config.Cmd)
		}
		if cf.Config.Labels["org.opencontainers.image.title"] != "gymtrace" {
			t.Errorf("%s labels %v", arch, cf.Config.Labels)
		}
		layers, err := img.Layers()
		must(t, err)
		if len(layers) != 1 {
			t.Fatalf("%s: %d layers, want 1 (FROM scratch)", arch, len(layers))
		}
		files := readLayer(t, layers[0])
		if !bytes.Equal(files[Entrypoint[1:]], body) {
			t.Errorf("%s: %s in the image differs from the binary", arch, Entrypoint)
		}
		f, err := elf.NewFile(bytes.NewReader(files[Entrypoint[1:]]))
		must(t, err)
		if f.Machine != elfMachine[arch] {
			t.Errorf("%s: binary is for %s", arch, f.Machine)
		}
	}
	h, err := idx.Digest()
	must(t, err)
	return h
}

func readLayer(t *testing.T, l v1.Layer) map[string][]byte {
	rc, err := l.Uncompressed()
	must(t, err)
	defer rc.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		must(t, err)
		if h.Typeflag == tar.TypeReg {
			if h.Name == Entrypoint[1:] && (h.Mode&0o111 == 0 || h.Uid != 0) {
				t.Errorf("%s mode %o uid %d", h.Name, h.Mode, h.Uid)
			}
			b, err := io.ReadAll(tr)
			must(t, err)
			files[h.Name] = b
		}
	}
}

func TestBuildMultiArch(t *testing.T) {
	bins := map[string]string{}
	want := map[string][]byte{}
	for _, a := range arches {
		bins[a] = hello(t, a)
		b, err := os.ReadFile(bins[a])
		must(t, err)
		want[a] = b
	}
	ca := filepath.Join(t.TempDir(), "ca.crt")
	must(t, os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\nnot a real one\n-----END CERTIFICATE-----\n"), 0o644))
	out := filepath.Join(t.TempDir(), "img")
	o := Options{Binaries: bins, CACerts: ca, Tag: "gymtrace:test", Out: out, Tarballs: true}
	d1, err := Build(o)
	must(t, err)
	if got := verifyLayout(t, out, "gymtrace:test", want); got != d1 {
		t.Errorf("layout index digest %s, Build returned %s", got, d1)
	}
	// Same inputs, same digest: nothing time- or host-dependent leaks in.
	d2, err := Build(o)
	must(t, err)
	if d1 != d2 {
		t.Errorf("rebuild changed the digest: %s then %s", d1, d2)
	}
	// The docker-archive tarballs load as images of the right arch.
	for _, a := range arches {
		img, err := tarball.ImageFromPath(filepath.Join(out, "gymtrace-"+a+".tar"), nil)
		must(t, err)
		cf, err := img.ConfigFile()
		must(t, err)
		if cf.Architecture != a {
			t.Errorf("tarball %s has arch %s", a, cf.Architecture)
		}
		layers, _ := img.Layers()
		if files := readLayer(t, layers[0]); string(files[CAPath[1:]]) == "" {
			t.Errorf("tarball %s lacks CA roots", a)
		}
	}
}

func TestBuildRejects(t *testing.T) {
	amd := hello(t, "amd64")
	out := filepath.Join(t.TempDir(), "img")
	if _, err := Build(Options{Binaries: map[string]string{"arm64": amd}, Out: out}); err == nil || !strings.Contains(err.Error(), "GOARCH=arm64") {
		t.Errorf("wrong-arch binary: %v", err)
	}
	if _, err := Build(Options{Binaries: map[string]string{"amd64": "/bin/true"}, Out: out}); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("dynamic binary: %v", err)
	}
	if _, err := Build(Options{Out: out}); err == nil {
		t.Error("no binaries: no error")
	}
}

// scripts/build-image end to end on the real command, for amd64 and arm64.
func TestBuildImageScript(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-builds gymtrace twice; skipped with -short")
	}
	root, err := filepath.Abs("../../..")
	must(t, err)
	if err := goBuild(t, root, "./cmd/gymtrace", "amd64", filepath.Join(t.TempDir(), "probe")); err != nil {
		t.Skipf("cmd/gymtrace does not build yet: %v", err)
	}
	out := filepath.Join(t.TempDir(), "img")
	cmd := exec.Command(filepath.Join(root, "scripts", "build-image"))
	cmd.Env = append(os.Environ(), "OUT="+out, "TAG=gymtrace:ci", "ARCHES=amd64,arm64", "SOURCE_DATE_EPOCH=0")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/build-image: %v\n%s", err, b)
	}
	want := map[string][]byte{}
	for _, a := range arches {
		img, err := tarball.ImageFromPath(filepath.Join(out, "gymtrace-"+a+".tar"), nil)
		must(t, err)
		layers, err := img.Layers()
		must(t, err)
		want[a] = readLayer(t, layers[0])[Entrypoint[1:]]
		if len(want[a]) < 1<<20 {
			t.Errorf("%s: gymtrace binary is only %d bytes", a, len(want[a]))
		}
	}
	verifyLayout(t, out, "gymtrace:ci", want)
	// A scratch image has no dynamic loader: the binary must be static.
	bin := filepath.Join(t.TempDir(), "gymtrace")
	must(t, os.WriteFile(bin, want["amd64"], 0o755))
	f, err := elf.Open(bin)
	must(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the image's binary is dynamically linked")
		}
	}
}
