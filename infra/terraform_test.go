package infra_test

// terraform validate, and the provider's schema, against the AWS provider in
// a local plugin mirror: no network, a few seconds, and a skip with the
// reason where this machine has no terraform or no mirror.
//
// The mirror may hold another major version of the provider than the module
// pins (5.100.0 where versions.tf says >= 6.8.0, < 7.0.0): the copy of the
// module validated here is pinned to the mirror's version instead. So this
// sees every argument, block, attribute reference and literal value the
// mirror's provider knows (a misspelled managed_drainin, a .regionx, a
// treat_missing_data of "notBreachin": see the test's allowances below for
// the difference it must tolerate), and it cannot see what 6.x changed: an
// argument 6.x removed or renamed passes here if 5.x had it, 6.x-only
// arguments are reported and must be listed in knownNewerThanMirror, and
// checks the provider makes only at plan time (max_message_size's range,
// values built from variables) run in neither. make infra-validate runs the
// real thing, with the pinned 6.x provider from the registry, on a machine
// with network access.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"
)

// knownNewerThanMirror is what the module uses that the AWS provider 5.x
// lacks and 6.x has: diagnostics of terraform validate (and names the schema
// check reports) that are about exactly these are the version gap, not a
// defect. Anything else fails.
var knownNewerThanMirror = []struct {
	file, summary string // of the validate diagnostic
	on, name      string // the resource or data source type, and the name
	why           string
}{
	{"main.tf", "Unsupported attribute", "data.aws_region", "region",
		"data.aws_region's region attribute is new in 6.0 (5.x calls it name, which 6.x deprecates)"},
}

// mirrorEnvVar names a plugin mirror directory to use instead of the usual
// places (pluginMirrors).
const mirrorEnvVar = "VRAMQ_TF_PLUGIN_MIRROR"

// pluginMirrors are where this looks for the AWS provider: the variable
// above, the mirror machines of this project's kind ship (/opt/tf-plugins),
// and Terraform's own implied local mirror directories ("Provider
// Installation", implied local mirror directories) on Unix.
func pluginMirrors() []string {
	var dirs []string
	if d := os.Getenv(mirrorEnvVar); d != "" {
		dirs = append(dirs, d)
	}
	dirs = append(dirs, "/opt/tf-plugins")
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, ".terraform.d", "plugins"))
		dirs = append(dirs, filepath.Join(home, ".local", "share", "terraform", "plugins"))
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		dirs = append(dirs, filepath.Join(x, "terraform", "plugins"))
	}
	return append(dirs, "/usr/local/share/terraform/plugins", "/usr/share/terraform/plugins")
}

// awsInMirror returns the version of hashicorp/aws that dir holds for this
// platform, in either mirror layout (unpacked: .../aws/<v>/<os>_<arch>/;
// packed: .../aws/terraform-provider-aws_<v>_<os>_<arch>.zip), or "".
func awsInMirror(dir string) string {
	base := filepath.Join(dir, "registry.terraform.io", "hashicorp", "aws")
	platform := runtime.GOOS + "_" + runtime.GOARCH
	entries, err := os.ReadDir(base)
	if err != nil {
		return ""
	}
	var versions []string
	for _, e := range entries {
		if e.IsDir() {
			if bins, _ := filepath.Glob(filepath.Join(base, e.Name(), platform, "terraform-provider-aws*")); len(bins) > 0 {
				versions = append(versions, e.Name())
			}
			continue
		}
		if v, ok := strings.CutPrefix(e.Name(), "terraform-provider-aws_"); ok && strings.HasSuffix(v, "_"+platform+".zip") {
			versions = append(versions, strings.TrimSuffix(v, "_"+platform+".zip"))
		}
	}
	if len(versions) == 0 {
		return ""
	}
	slices.SortFunc(versions, func(a, b string) int { return compareVersions(a, b) })
	return versions[len(versions)-1]
}

func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		var x, y int
		fmt.Sscan(pa[i], &x)
		fmt.Sscan(pb[i], &y)
		if x != y {
			return x - y
		}
	}
	return len(pa) - len(pb)
}

// tfWorkspace is a copy of infra/ initialised against the mirror, shared by
// the tests here (one init, a few seconds).
type tfWorkspace struct {
	skip      string // why the tests skip; "" when ready
	err       error  // set-up failed where it should not have
	root      string // the copy of infra/
	version   string // the provider version in the mirror
	terraform string
	env       []string

	// validate and providers schema run at once, after init (each starts
	// the provider): done closes when both have.
	done        chan struct{}
	validate    []tfDiagnostic
	validateErr error
	schema      *providerSchema
	schemaErr   error
}

var (
	workspaceOnce sync.Once
	workspace     *tfWorkspace
)

// terraformWorkspace sets the copy up once; TestMain removes it.
func terraformWorkspace(t *testing.T) *tfWorkspace {
	t.Helper()
	workspaceOnce.Do(func() { workspace = newWorkspace() })
	switch {
	case workspace.err != nil:
		t.Fatal(workspace.err)
	case workspace.skip != "":
		t.Skip(workspace.skip)
	}
	return workspace
}

func newWorkspace() *tfWorkspace {
	w := &tfWorkspace{}
	tf, err := exec.LookPath("terraform")
	if err != nil {
		w.skip = "no terraform on PATH: terraform validate and the provider schema check did not run"
		return w
	}
	w.terraform = tf
	var mirror string
	for _, d := range pluginMirrors() {
		if v := awsInMirror(d); v != "" {
			mirror, w.version = d, v
			break
		}
	}
	if mirror == "" {
		w.skip = fmt.Sprintf("no hashicorp/aws provider for %s_%s in a local plugin mirror (%s, or set %s): terraform validate and the provider schema check did not run",
			runtime.GOOS, runtime.GOARCH, strings.Join(pluginMirrors(), ", "), mirrorEnvVar)
		return w
	}
	dir, err := os.MkdirTemp("", "vramq-infra-validate-")
	if err != nil {
		w.err = err
		return w
	}
	w.root = filepath.Join(dir, "infra")
	if w.err = copyModules(".", w.root, w.version); w.err != nil {
		return w
	}
	// The mirror and nothing else: no "direct" method, so init cannot reach
	// the registry, and no checkpoint (Terraform's version check).
	cli := filepath.Join(dir, "cli.tfrc")
	conf := fmt.Sprintf("provider_installation {\n  filesystem_mirror {\n    path    = %q\n    include = [\"registry.terraform.io/hashicorp/aws\"]\n  }\n}\n", mirror)
	if w.err = os.WriteFile(cli, []byte(conf), 0o644); w.err != nil {
		return w
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TF_") {
			w.env = append(w.env, kv)
		}
	}
	w.env = append(w.env, "TF_CLI_CONFIG_FILE="+cli, "CHECKPOINT_DISABLE=1", "TF_IN_AUTOMATION=1", "TF_INPUT=0")
	// The example uses the root module (source = "../.."): one init and one
	// validate cover both.
	if out, err := w.run("init", "-backend=false", "-input=false", "-no-color"); err != nil {
		w.err = fmt.Errorf("terraform init against the mirror %s (aws %s): %v\n%s", mirror, w.version, err, out)
		return w
	}
	w.done = make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); w.validate, w.validateErr = w.runValidate() }()
	go func() { defer wg.Done(); w.schema, w.schemaErr = w.runSchema() }()
	go func() { wg.Wait(); close(w.done) }()
	return w
}

func (w *tfWorkspace) example() string { return filepath.Join(w.root, "examples", "complete") }

func (w *tfWorkspace) run(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.terraform, append([]string{"-chdir=" + w.example()}, args...)...)
	cmd.Env = w.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return append(out, stderr.Bytes()...), err
	}
	return out, nil
}

// copyModules copies every .tf file under src to dst, keeping the layout,
// with the AWS provider's version constraint replaced by exactly version.
func copyModules(src, dst, version string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".tf") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, diags := hclwrite.ParseConfig(b, path, hcl.InitialPos)
		if diags.HasErrors() {
			return diags
		}
		for _, tf := range f.Body().Blocks() {
			if tf.Type() != "terraform" {
				continue
			}
			for _, rp := range tf.Body().Blocks() {
				if rp.Type() != "required_providers" || rp.Body().GetAttribute("aws") == nil {
					continue
				}
				rp.Body().SetAttributeValue("aws", cty.ObjectVal(map[string]cty.Value{
					"source":  cty.StringVal("hashicorp/aws"),
					"version": cty.StringVal("= " + version),
				}))
			}
		}
		out := filepath.Join(dst, path)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		return os.WriteFile(out, f.Bytes(), 0o644)
	})
}

// tfDiagnostic is one diagnostic of terraform validate -json.
type tfDiagnostic struct {
	Severity string `json:"severity"`
	Summary  string `json:"summary"`
	Detail   string `json:"detail"`
	Range    *struct {
		Filename string `json:"filename"`
		Start    struct {
			Line int `json:"line"`
		} `json:"start"`
	} `json:"range"`
	Snippet *struct {
		Code string `json:"code"`
	} `json:"snippet"`
}

func (d tfDiagnostic) String() string {
	where := "(no location)"
	if d.Range != nil {
		where = fmt.Sprintf("%s:%d", d.Range.Filename, d.Range.Start.Line)
	}
	return fmt.Sprintf("%s: %s: %s: %s", where, d.Severity, d.Summary, d.Detail)
}

// known reports which allowance of knownNewerThanMirror covers d, if any.
func (d tfDiagnostic) known() (string, bool) {
	for _, k := range knownNewerThanMirror {
		if d.Range == nil || filepath.Base(d.Range.Filename) != k.file || d.Summary != k.summary {
			continue
		}
		if strings.Contains(d.Detail, fmt.Sprintf("named %q", k.name)) {
			return k.why, true
		}
	}
	return "", false
}

func (w *tfWorkspace) runValidate() ([]tfDiagnostic, error) {
	// validate exits 1 when it finds errors; its JSON says what they are.
	out, err := w.run("validate", "-json", "-no-color")
	var res struct {
		Diagnostics []tfDiagnostic `json:"diagnostics"`
	}
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		return nil, fmt.Errorf("terraform validate -json: %v (%v)\n%.2000s", jerr, err, out)
	}
	return res.Diagnostics, nil
}

func (w *tfWorkspace) validateDiagnostics(t *testing.T) []tfDiagnostic {
	t.Helper()
	<-w.done
	if w.validateErr != nil {
		t.Fatal(w.validateErr)
	}
	return w.validate
}

// TestTerraformValidate runs terraform validate on examples/complete, which
// validates the root module as its child, against the mirror's provider.
func TestTerraformValidate(t *testing.T) {
	w := terraformWorkspace(t)
	t.Logf("terraform validate against hashicorp/aws %s from a local mirror (the module pins 6.x: see the top of this file for what that can and cannot see)", w.version)
	for _, d := range w.validateDiagnostics(t) {
		if why, ok := d.known(); ok {
			t.Logf("allowed, a provider 6.x feature the mirror's %s lacks (%s): %s", w.version, why, d)
			continue
		}
		t.Errorf("terraform validate: %s", d)
	}
}

// providerSchema is the part of terraform providers schema -json used here.
type providerSchema struct {
	Resources   map[string]schemaBlock `json:"resource_schemas"`
	DataSources map[string]schemaBlock `json:"data_source_schemas"`
}

type schemaBlock struct {
	Block blockSchema `json:"block"`
}

type blockSchema struct {
	Attributes map[string]struct {
		Type json.RawMessage `json:"type"`
	} `json:"attributes"`
	BlockTypes map[string]struct {
		Block blockSchema `json:"block"`
	} `json:"block_types"`
}

// objectAttributes returns the attribute names of the objects an attribute
// of type list or set of object holds: such an attribute (aws_security_group's
// ingress, say) may be written as blocks ("attributes as blocks").
func (s blockSchema) objectAttributes(name string) (map[string]bool, bool) {
	a, ok := s.Attributes[name]
	if !ok {
		return nil, false
	}
	var typ []json.RawMessage // ["list", ["object", {...}]]
	if json.Unmarshal(a.Type, &typ) != nil || len(typ) != 2 {
		return nil, false
	}
	var kind string
	var elem []json.RawMessage
	if json.Unmarshal(typ[0], &kind) != nil || (kind != "list" && kind != "set") || json.Unmarshal(typ[1], &elem) != nil || len(elem) != 2 {
		return nil, false
	}
	var attrs map[string]json.RawMessage
	if json.Unmarshal(elem[0], &kind) != nil || kind != "object" || json.Unmarshal(elem[1], &attrs) != nil {
		return nil, false
	}
	names := map[string]bool{}
	for n := range attrs {
		names[n] = true
	}
	return names, true
}

func (w *tfWorkspace) runSchema() (*providerSchema, error) {
	out, err := w.run("providers", "schema", "-json")
	if err != nil {
		return nil, fmt.Errorf("terraform providers schema -json: %v\n%.2000s", err, out)
	}
	var all struct {
		Schemas map[string]providerSchema `json:"provider_schemas"`
	}
	if err := json.Unmarshal(out, &all); err != nil {
		return nil, err
	}
	s, ok := all.Schemas["registry.terraform.io/hashicorp/aws"]
	if !ok {
		return nil, fmt.Errorf("terraform providers schema -json: no registry.terraform.io/hashicorp/aws among %v", keys(all.Schemas))
	}
	return &s, nil
}

func (w *tfWorkspace) providerSchema(t *testing.T) *providerSchema {
	t.Helper()
	<-w.done
	if w.schemaErr != nil {
		t.Fatal(w.schemaErr)
	}
	return w.schema
}

// metaArguments are Terraform's own, in any resource or data block.
var metaArguments = map[string]bool{"count": true, "for_each": true, "provider": true, "depends_on": true, "lifecycle": true, "provisioner": true, "connection": true}

// TestEveryAttributeIsInTheProviderSchema checks the names this module
// writes and reads against the provider's own schema, read from the binary
// in the mirror: every argument and nested block of every resource and data
// source (dynamic blocks by their label), and every attribute a reference
// reads (aws_lb.publisher[0].arn_suffix). terraform validate checks the same
// and more; this says it per name and file, and runs on the root module and
// every example on their own.
func TestEveryAttributeIsInTheProviderSchema(t *testing.T) {
	w := terraformWorkspace(t)
	schema := w.providerSchema(t)
	newer := map[string]bool{} // "data.aws_region region"
	for _, k := range knownNewerThanMirror {
		newer[k.on+" "+k.name] = true
	}
	checked := 0
	for _, m := range modules(t) {
		blocks := map[string]blockSchema{}
		for key, b := range m.resources {
			s, ok := schema.Resources[b.Labels[0]]
			if !ok {
				t.Errorf("%s: %s: no resource type %s in the provider %s", m.dir, b.DefRange(), b.Labels[0], w.version)
				continue
			}
			blocks["resource."+key] = s.Block
			checked += checkBody(t, m.dir, b.Body, s.Block, true)
		}
		for key, b := range m.data {
			s, ok := schema.DataSources[b.Labels[0]]
			if !ok {
				t.Errorf("%s: %s: no data source %s in the provider %s", m.dir, b.DefRange(), b.Labels[0], w.version)
				continue
			}
			blocks["data."+key] = s.Block
			checked += checkBody(t, m.dir, b.Body, s.Block, true)
		}
		// References: type.name[index].attribute, data.type.name.attribute.
		for _, tr := range m.traversals() {
			key, rest := "", hcl.Traversal(nil)
			switch root := tr.RootName(); {
			case root == "data" && len(tr) > 2:
				key, rest = "data."+attrName(tr[1])+"."+attrName(tr[2]), tr[3:]
			case strings.HasPrefix(root, "aws_") && len(tr) > 1:
				key, rest = "resource."+root+"."+attrName(tr[1]), tr[2:]
			default:
				continue
			}
			b, ok := blocks[key]
			if !ok {
				continue // TestEveryReferenceResolves reports it
			}
			if len(rest) > 0 {
				if _, idx := rest[0].(hcl.TraverseIndex); idx {
					rest = rest[1:]
				}
			}
			if len(rest) == 0 {
				continue
			}
			name := attrName(rest[0])
			_, attr := b.Attributes[name]
			_, blk := b.BlockTypes[name]
			checked++
			typ := key[:strings.LastIndex(key, ".")] // resource.aws_lb, data.aws_region
			if !attr && !blk && !newer[strings.TrimPrefix(typ, "resource.")+" "+name] {
				t.Errorf("%s: %s: %s has no attribute %q in the provider %s", m.dir, tr.SourceRange(), key, name, w.version)
			}
		}
	}
	if checked < 200 {
		t.Errorf("only %d names checked against the schema", checked)
	}
}

func attrName(s hcl.Traverser) string {
	switch s := s.(type) {
	case hcl.TraverseAttr:
		return s.Name
	case hcl.TraverseRoot:
		return s.Name
	}
	return ""
}

// checkBody reports the arguments and blocks of body that s lacks, nested
// blocks included, and returns how many names it checked.
func checkBody(t *testing.T, dir string, body *hclsyntax.Body, s blockSchema, top bool) int {
	t.Helper()
	n := 0
	for name, a := range body.Attributes {
		if top && metaArguments[name] {
			continue
		}
		n++
		if _, ok := s.Attributes[name]; !ok {
			t.Errorf("%s: %s: argument %q is not in the provider's schema here", dir, a.SrcRange, name)
		}
	}
	for _, b := range body.Blocks {
		name, content := b.Type, b.Body
		if top && metaArguments[name] {
			continue
		}
		if name == "dynamic" && len(b.Labels) == 1 {
			name, content = b.Labels[0], nil
			for _, c := range blocksOf(b.Body, "content") {
				content = c.Body
			}
		}
		n++
		if names, ok := s.objectAttributes(name); ok && content != nil {
			for an, a := range content.Attributes {
				n++
				if !names[an] {
					t.Errorf("%s: %s: %q is not an attribute of %s's objects in the provider's schema", dir, a.SrcRange, an, name)
				}
			}
			continue
		}
		nested, ok := s.BlockTypes[name]
		if !ok {
			t.Errorf("%s: %s: block %q is not in the provider's schema here", dir, b.DefRange(), name)
			continue
		}
		if content != nil {
			n += checkBody(t, dir, content, nested.Block, false)
		}
	}
	return n
}

func TestMain(m *testing.M) {
	code := m.Run()
	if workspace != nil && workspace.root != "" {
		_ = os.RemoveAll(filepath.Dir(workspace.root))
	}
	os.Exit(code)
}
