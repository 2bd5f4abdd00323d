// Package image assembles gymtrace's container image without a Docker daemon
// or a base image: one layer holding the static binary (and, optionally, CA
// roots for an OTLP endpoint over TLS), FROM scratch semantics, written as an
// OCI image layout with one manifest per architecture under one index.
package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Entrypoint is where the binary sits in the image.
const Entrypoint = "/gymtrace"

// CAPath is where CA roots go (Go's crypto/x509 looks there first on Linux).
const CAPath = "/etc/ssl/certs/ca-certificates.crt"

// Options says what to build.
type Options struct {
	Binaries map[string]string // GOARCH -> path of a static linux binary
	CACerts  string            // host file copied to CAPath; "" for none
	Tag      string            // e.g. "gymtrace:dev": the layout's ref name and the tarballs' tag
	Out      string            // OCI layout directory (replaced)
	Tarballs bool              // also write Out/gymtrace-<arch>.tar (docker/podman load)
	Created  time.Time         // image creation time; zero: the Unix epoch, for reproducible digests
	Version  string            // org.opencontainers.image.version label
}

var elfMachine = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"riscv64": elf.EM_RISCV,
}

// Build writes the image and returns the index digest.
func Build(o Options) (v1.Hash, error) {
	if len(o.Binaries) == 0 {
		return v1.Hash{}, fmt.Errorf("no binaries given: pass --binary ARCH=PATH")
	}
	if o.Tag == "" {
		o.Tag = "gymtrace:dev"
	}
	tag, err := name.NewTag(o.Tag)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image tag %q: %w", o.Tag, err)
	}
	var ca []byte
	if o.CACerts != "" {
		if ca, err = os.ReadFile(o.CACerts); err != nil {
			return v1.Hash{}, fmt.Errorf("reading CA roots: %w; pass --ca '' to build without them", err)
		}
	}
	arches := make([]string, 0, len(o.Binaries))
	for a := range o.Binaries {
		arches = append(arches, a)
	}
	sort.Strings(arches)

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	imgs := map[string]v1.Image{}
	for _, arch := range arches {
		img, err := archImage(arch, o.Binaries[arch], ca, o)
		if err != nil {
			return v1.Hash{}, err
		}
		imgs[arch] = img
		p := &v1.Platform{OS: "linux", Architecture: arch}
		if arch == "arm64" {
			p.Variant = "v8"
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: p}})
	}

	if err := os.RemoveAll(o.Out); err != nil {
		return v1.Hash{}, fmt.Errorf("clearing %s: %w", o.Out, err)
	}
	lp, err := layout.Write(o.Out, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("creating OCI layout %s: %w", o.Out, err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.String(),
	})); err != nil {
		return v1.Hash{}, fmt.Errorf("writing the image index to %s: %w", o.Out, err)
	}
	if o.Tarballs {
		for _, arch := range arches {
			p := filepath.Join(o.Out, "gymtrace-"+arch+".tar")
			if err := tarball.WriteToFile(p, tag, imgs[arch]); err != nil {
				return v1.Hash{}, fmt.Errorf("writing %s: %w", p, err)
			}
		}
	}
	return idx.Digest()
}

func archImage(arch, bin string, ca []byte, o Options) (v1.Image, error) {
	if err := checkStatic(arch, bin); err != nil {
		return nil, err
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("reading the %s binary: %w", arch, err)
	}
	layerTar, err := rootfs(exe, ca)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("making the %s layer: %w", arch, err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, fmt.Errorf("adding the %s layer: %w", arch, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	if arch == "arm64" {
		cf.Variant = "v8"
	}
	cf.Created = v1.Time{Time: o.Created.UTC()}
	cf.Config.Entrypoint = []string{Entrypoint}
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=/"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       "gymtrace",
		"org.opencontainers.image.description": "zero-code eBPF tracer for NVIDIA NeMo Gym",
		"org.opencontainers.image.source":      "https://github.com/gymtrace/gymtrace",
	}
	if o.Version != "" {
		cf.Config.Labels["org.opencontainers.image.version"] = o.Version
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the %s image config: %w", arch, err)
	}
	return mutate.CreatedAt(img, cf.Created)
}

// checkStatic refuses a binary for the wrong architecture or one that needs a
// dynamic loader, which a scratch image does not have.
func checkStatic(arch, path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("reading the %s binary %s: %w", arch, path, err)
	}
	defer f.Close()
	if want, ok := elfMachine[arch]; ok && f.Machine != want {
		return fmt.Errorf("%s is built for %s, not %s: build it with GOARCH=%s", path, f.Machine, arch, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; a scratch image needs `CGO_ENABLED=0 go build`", path)
		}
	}
	return nil
}

// rootfs is the image's only layer, with fixed owners and times so that the
// same binary always gives the same digest.
func rootfs(exe, ca []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, body []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	steps := []func() error{
		func() error { return file(Entrypoint[1:], 0o755, exe) },
		func() error { return dir("tmp/") },
	}
	if ca != nil {
		steps = append(steps,
			func() error { return dir("etc/") },
			func() error { return dir("etc/ssl/") },
			func() error { return dir("etc/ssl/certs/") },
			func() error { return file(CAPath[1:], 0o644, ca) })
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, fmt.Errorf("writing the image layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("writing the image layer: %w", err)
	}
	return buf.Bytes(), nil
}
