package infra_test

// Invariants between the Terraform and the Go code it deploys, read from
// the code itself so that a new route, a new key prefix or a new start-up
// check of the subscriber cannot be missed here (issue 25, items 12 to 16).

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/vramq/vramq/internal/bytesize"
	"github.com/vramq/vramq/subscriber"
)

// ---------------------------------------------------------------------------
// Routes (item 12)
// ---------------------------------------------------------------------------

// muxRoute is one pattern of publisher.Handler's mux that names a method.
type muxRoute struct {
	method, path string
	auth         bool // the handler is wrapped in p.auth
}

// publisherRoutes reads the method patterns of publisher.Handler's mux from
// the publisher's code, every package of it (the jobs, files and batches
// register their own routes): mux.Handle("GET /v1/jobs/{id}", auth(...)), and
// a call of a local helper that registers what it is given, such as
// route("POST /v1/messages/batches", h) where route wraps h in the auth.
func publisherRoutes(t *testing.T) []muxRoute {
	t.Helper()
	var out []muxRoute
	err := filepath.WalkDir(filepath.Join("..", "publisher"), func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && d.Name() == "testdata":
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		out = append(out, fileRoutes(t, path)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 3 {
		t.Fatalf("publisher/: only %d method routes found in the mux: %v", len(out), out)
	}
	return out
}

// fileRoutes is publisherRoutes for one file.
func fileRoutes(t *testing.T, path string) []muxRoute {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Local helpers that register a route: name := func(pattern string, ...) { mux.Handle(...) }.
	registrars := map[string]*ast.FuncLit{}
	ast.Inspect(f, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || len(as.Lhs) != len(as.Rhs) {
			return true
		}
		for i, lhs := range as.Lhs {
			id, ok := lhs.(*ast.Ident)
			fl, isFunc := as.Rhs[i].(*ast.FuncLit)
			if ok && isFunc && calls(fl, "Handle", "HandleFunc") {
				registrars[id.Name] = fl
			}
		}
		return true
	})
	var out []muxRoute
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 2 {
			return true
		}
		wrappers := []ast.Node{call.Args[1]}
		switch fun := call.Fun.(type) {
		case *ast.SelectorExpr:
			if fun.Sel.Name != "Handle" && fun.Sel.Name != "HandleFunc" {
				return true
			}
		case *ast.Ident:
			fl, ok := registrars[fun.Name]
			if !ok {
				return true
			}
			wrappers = append(wrappers, fl)
		default:
			return true
		}
		lit, ok := call.Args[0].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		pattern, _ := strconv.Unquote(lit.Value)
		method, p, found := strings.Cut(pattern, " ")
		if !found {
			return true // a method-less pattern: the JSON 404s and 405s
		}
		r := muxRoute{method: method, path: p}
		for _, w := range wrappers {
			r.auth = r.auth || calls(w, "Auth", "auth")
		}
		out = append(out, r)
		return true
	})
	return out
}

// calls says whether n holds a selector x.name for any of names.
func calls(n ast.Node, names ...string) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok && slices.Contains(names, s.Sel.Name) {
			found = true
		}
		return !found
	})
	return found
}

// An HTTP API answers 404 itself for a method and path no route names, so a
// handler of the publisher's mux without a route is an endpoint Lambda-mode
// clients cannot reach: DELETE /v1/jobs/{id} (cancel) was one. Both use
// {name} for a path variable. The load balancer (Fargate) forwards by path.
func TestEveryPublisherRouteHasAnAPIGatewayRoute(t *testing.T) {
	m := root(t)
	routes := m.eval(t, m.locals["publisher_routes"].Expr, nil)
	if !routes.IsKnown() || !routes.Type().IsObjectType() {
		t.Fatalf("local.publisher_routes is not a map of route keys: %#v", routes)
	}
	gateway := map[string]bool{}
	for k, v := range routes.AsValueMap() {
		gateway[k] = v.True()
	}
	alb := m.eval(t, m.locals["publisher_alb_paths"].Expr, nil)
	mux := map[string]bool{}
	for _, r := range publisherRoutes(t) {
		key := r.method + " " + r.path
		mux[key] = true
		authorized, ok := gateway[key]
		switch {
		case !ok:
			t.Errorf("the publisher serves %s, and the HTTP API has no route for it (local.publisher_routes): API Gateway answers it 404 in lambda mode", key)
		case authorized != r.auth:
			t.Errorf("%s: the publisher authorises it: %v, the HTTP API route: %v", key, r.auth, authorized)
		}
		sample := regexp.MustCompile(`\{[^}]+\}`).ReplaceAllString(r.path, "j-0123")
		if !slices.ContainsFunc(alb.AsValueSlice(), func(p cty.Value) bool { return albPathMatch(p.AsString(), sample) }) {
			t.Errorf("%s: no path pattern of the load balancer forwards %s (fargate mode)", key, sample)
		}
	}
	for key := range gateway {
		if !mux[key] {
			t.Errorf("the HTTP API routes %s, which the publisher does not serve", key)
		}
	}
}

// ---------------------------------------------------------------------------
// The bucket's key prefixes (items 13 and 15)
// ---------------------------------------------------------------------------

// layoutPrefixes reads the key prefixes of the bucket layout from
// job/bucket.go: the string literal that starts each key it builds
// ("results/" + jobID + ...).
func layoutPrefixes(t *testing.T) []string {
	t.Helper()
	path := filepath.Join("..", "job", "bucket.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		b, ok := n.(*ast.BinaryExpr)
		if !ok || b.Op != token.ADD {
			return true
		}
		left := ast.Expr(b)
		for {
			if bb, ok := left.(*ast.BinaryExpr); ok && bb.Op == token.ADD {
				left = bb.X
				continue
			}
			break
		}
		if lit, ok := left.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			s, _ := strconv.Unquote(lit.Value)
			if regexp.MustCompile(`^[a-z]+/$`).MatchString(s) {
				seen[strings.TrimSuffix(s, "/")] = true
			}
		}
		return true
	})
	if len(seen) < 5 {
		t.Fatalf("%s: only %d key prefixes found: %v", path, len(seen), keys(seen))
	}
	return sorted(keys(seen))
}

// roleS3 is what one IAM role may do in the payload bucket, by key prefix.
type roleS3 struct {
	get, put, list map[string]bool
}

// s3ByRole gathers, per aws_iam_role, the bucket prefixes the policy
// documents attached to it (aws_iam_role_policy) allow to get, put and list,
// dynamic statements and optional policies (completion_events) included.
func s3ByRole(t *testing.T, m *module) map[string]*roleS3 {
	t.Helper()
	prefixOf := regexp.MustCompile(`^/([a-z]+)/\*$`)
	out := map[string]*roleS3{}
	for name, rp := range m.resourcesOf("aws_iam_role_policy") {
		var role, doc string
		for _, tr := range rp.Body.Attributes["role"].Expr.Variables() {
			if tr.RootName() == "aws_iam_role" {
				role = attrName(tr[1])
			}
		}
		for _, tr := range rp.Body.Attributes["policy"].Expr.Variables() {
			if tr.RootName() == "data" && len(tr) > 2 && attrName(tr[1]) == "aws_iam_policy_document" {
				doc = attrName(tr[2])
			}
		}
		if role == "" || doc == "" {
			t.Errorf("aws_iam_role_policy.%s: no role or policy document found", name)
			continue
		}
		r := out[role]
		if r == nil {
			r = &roleS3{get: map[string]bool{}, put: map[string]bool{}, list: map[string]bool{}}
			out[role] = r
		}
		for _, st := range statements(m.data["aws_iam_policy_document."+doc].Body) {
			a, ok := st.Attributes["actions"]
			if !ok {
				continue
			}
			acts := literalText(a.Expr)
			var resources []string
			if res, ok := st.Attributes["resources"].Expr.(*hclsyntax.TupleConsExpr); ok {
				for _, e := range res.Exprs {
					if p := prefixOf.FindStringSubmatch(literalText(e)); p != nil {
						resources = append(resources, p[1])
					}
				}
			}
			for _, p := range resources {
				if strings.Contains(acts, "s3:GetObject") {
					r.get[p] = true
				}
				if strings.Contains(acts, "s3:PutObject") {
					r.put[p] = true
				}
			}
			if !strings.Contains(acts, "s3:ListBucket") {
				continue
			}
			for _, c := range blocksOf(st, "condition") {
				if literalText(c.Body.Attributes["variable"].Expr) != "s3:prefix" {
					continue
				}
				for _, v := range m.eval(t, c.Body.Attributes["values"].Expr, nil).AsValueSlice() {
					r.list[strings.TrimSuffix(v.AsString(), "/*")] = true
				}
			}
		}
	}
	return out
}

// Every prefix of the layout expires (payload_expiration_days, which the
// lifecycle configuration iterates, and whose validation must take it: done/
// had neither), and every role that reads or writes a prefix may list it: S3
// answers a missing key 404 only to a caller with s3:ListBucket, 403 to
// anyone else, so without it a missing done marker or manifest was a failed
// check and no completion event was ever sent on AWS.
func TestEveryKeyPrefixExpiresAndListsForItsReaders(t *testing.T) {
	m := root(t)
	layout := layoutPrefixes(t)

	days := expirationDays(t, m, nil)
	for _, p := range layout {
		if _, ok := days[p]; !ok {
			t.Errorf("%s/ (job/bucket.go) has no expiry: payload_expiration_days has no default for it", p)
		}
		if !m.validates(t, "payload_expiration_days", cty.MapVal(map[string]cty.Value{p: cty.NumberIntVal(7)})) {
			t.Errorf("payload_expiration_days refuses a key %q: its prefix could never be given an expiry", p)
		}
	}

	// With every optional policy attached.
	roles := s3ByRole(t, m)
	for _, want := range []string{"subscriber_task", "publisher"} {
		if roles[want] == nil {
			t.Fatalf("no S3 permissions found for aws_iam_role.%s", want)
		}
	}
	listed := map[string]bool{}
	for role, r := range roles {
		for p := range r.list {
			listed[p] = true
		}
		for _, set := range []map[string]bool{r.get, r.put, r.list} {
			for p := range set {
				if !slices.Contains(layout, p) {
					t.Errorf("aws_iam_role.%s: %s/ is no prefix of the bucket layout (job/bucket.go)", role, p)
				}
			}
		}
		// A read is where 404 and 403 differ (a plain put needs no list; a
		// PutIfAbsent reads, and TestTheSubscriberMayReadWhatItWrites makes
		// every subscriber write a read too).
		for p := range r.get {
			if !r.list[p] {
				t.Errorf("aws_iam_role.%s reads %s/* but its s3:ListBucket condition does not cover %s/*: a missing key there reads as 403, not 404", role, p, p)
			}
		}
	}
	for _, p := range layout {
		if !listed[p] {
			t.Errorf("%s/ (job/bucket.go): no role may list it (no s3:ListBucket condition covers it)", p)
		}
	}
}

// ---------------------------------------------------------------------------
// Scaling (item 14): the metric math, evaluated as CloudWatch documents it
// ---------------------------------------------------------------------------

// metricMath evaluates a CloudWatch metric math expression of plain
// arithmetic (+ - * / ^, parentheses, numbers, metric ids) for one
// timestamp: a data point that would divide by zero is dropped (ok false),
// and a timestamp where every metric is missing has no data point. What
// arithmetic does with a value missing from one operand is read two ways
// (missing): as 0, or as dropping the data point; callers ask both, so no
// verdict rests on one reading of "Using metric math". With fill, FILL(id,
// n) is taken too: id's value, or n where it is missing (CloudWatch's FILL,
// which alarms take). Any other function is an error: the Application Auto
// Scaling guide on metric math names the arithmetic operators, and what
// CloudWatch does with the rest in a target tracking policy is not what
// this checks.
func metricMath(expr string, values map[string]*float64, missing missingReading, fill bool) (v float64, ok bool, err error) {
	toks := regexp.MustCompile(`\s*([A-Za-z_][A-Za-z0-9_]*|[0-9]+(?:\.[0-9]+)?|[-+*/^(),]|\S)`).FindAllStringSubmatch(expr, -1)
	var pos int
	present := false
	for _, v := range values {
		present = present || v != nil
	}
	if !present {
		return 0, false, nil
	}
	peek := func() string {
		if pos < len(toks) {
			return toks[pos][1]
		}
		return ""
	}
	dropped := false
	var sum, product, power, unary func() (float64, error)
	sum = func() (float64, error) {
		x, err := product()
		for err == nil && (peek() == "+" || peek() == "-") {
			op := peek()
			pos++
			var y float64
			if y, err = product(); op == "+" {
				x += y
			} else {
				x -= y
			}
		}
		return x, err
	}
	product = func() (float64, error) {
		x, err := power()
		for err == nil && (peek() == "*" || peek() == "/") {
			op := peek()
			pos++
			var y float64
			y, err = power()
			switch {
			case op == "*":
				x *= y
			case y == 0:
				dropped = true
			default:
				x /= y
			}
		}
		return x, err
	}
	power = func() (float64, error) {
		x, err := unary()
		if err == nil && peek() == "^" {
			pos++
			var y float64
			if y, err = power(); err == nil {
				r := 1.0
				for range int(y) {
					r *= x
				}
				x = r
			}
		}
		return x, err
	}
	unary = func() (float64, error) {
		tok := peek()
		pos++
		switch {
		case tok == "-":
			x, err := unary()
			return -x, err
		case tok == "(":
			x, err := sum()
			if peek() != ")" {
				return 0, fmt.Errorf("%q: missing )", expr)
			}
			pos++
			return x, err
		case regexp.MustCompile(`^[0-9]`).MatchString(tok):
			return strconv.ParseFloat(tok, 64)
		case regexp.MustCompile(`^[a-z]`).MatchString(tok):
			if peek() == "(" {
				return 0, fmt.Errorf("%q: %s(...) is a function, not plain arithmetic", expr, tok)
			}
			v, ok := values[tok]
			if !ok {
				return 0, fmt.Errorf("%q: %s is no metric of the query", expr, tok)
			}
			if v == nil {
				dropped = dropped || missing == missingDrops
				return 0, nil
			}
			return *v, nil
		case fill && tok == "FILL" && peek() == "(":
			pos++
			id := peek()
			pos++
			v, ok := values[id]
			if !ok || peek() != "," {
				return 0, fmt.Errorf("%q: FILL takes a metric id and a number here", expr)
			}
			pos++
			n, err := strconv.ParseFloat(peek(), 64)
			pos++
			if err != nil || peek() != ")" {
				return 0, fmt.Errorf("%q: FILL takes a metric id and a number here", expr)
			}
			pos++
			if v == nil {
				return n, nil
			}
			return *v, nil
		case regexp.MustCompile(`^[A-Z]`).MatchString(tok):
			return 0, fmt.Errorf("%q: %s is a function, not plain arithmetic", expr, tok)
		}
		return 0, fmt.Errorf("%q: unexpected %q", expr, tok)
	}
	v, err = sum()
	if err == nil && pos != len(toks) {
		err = fmt.Errorf("%q: unexpected %q", expr, peek())
	}
	return v, !dropped, err
}

// missingReading is how metricMath reads a value missing from one operand.
type missingReading int

const (
	missingZero  missingReading = iota // the value is 0
	missingDrops                       // the timestamp has no data point
)

var missingReadings = map[missingReading]string{missingZero: "a missing value read as 0", missingDrops: "a missing value dropping the data point"}

// metricQuery is a policy's or an alarm's metric math: its metrics by id
// (their metric_name), and the expression whose data it returns.
type metricQuery struct {
	metrics map[string]string
	expr    string
}

// metricsOf reads the metric math of blocks of type typ (the policy's
// "metrics", the alarm's "metric_query"); the metric itself sits in a
// "metric" block, directly (alarm) or in "metric_stat" (policy).
func metricsOf(t *testing.T, m *module, body *hclsyntax.Body, typ string) metricQuery {
	t.Helper()
	q := metricQuery{metrics: map[string]string{}}
	for _, mb := range blocksOf(body, typ) {
		id := m.attr(t, mb, "id", nil).AsString()
		metricBlocks := blocksOf(mb.Body, "metric")
		for _, ms := range blocksOf(mb.Body, "metric_stat") {
			metricBlocks = append(metricBlocks, blocksOf(ms.Body, "metric")...)
		}
		for _, mm := range metricBlocks {
			q.metrics[id] = m.attr(t, mm, "metric_name", nil).AsString()
		}
		if r := m.attr(t, mb, "return_data", nil); r.IsKnown() && !r.IsNull() && r.True() {
			q.expr = m.attr(t, mb, "expression", nil).AsString()
		}
	}
	if q.expr == "" {
		t.Fatalf("%s: no %s returns an expression", body.SrcRange, typ)
	}
	return q
}

// eval evaluates q with the metrics given by name (nil: missing), reading
// a missing operand as missing says; fill allows FILL (alarms).
func (q metricQuery) eval(t *testing.T, byName map[string]*float64, missing missingReading, fill bool) (float64, bool) {
	t.Helper()
	values := map[string]*float64{}
	for id, name := range q.metrics {
		values[id] = byName[name]
	}
	v, ok, err := metricMath(q.expr, values, missing, fill)
	if err != nil {
		t.Fatal(err)
	}
	return v, ok
}

func f(v float64) *float64 { return &v }

const (
	visibleMetric  = "ApproximateNumberOfMessagesVisible"
	inFlightMetric = "ApproximateNumberOfMessagesNotVisible"
	desiredMetric  = "DesiredTaskCount"
)

// A fleet that keeps up shows about 0 visible messages while every task
// holds messages in flight: counting visible ones only, target tracking read
// 0 and scaled busy tasks in, to zero. The metric must count in-flight
// messages, never read 0 while any message waits, and stay per task.
func TestScaleInCountsMessagesInFlight(t *testing.T) {
	m := root(t)
	p := m.resource(t, "aws_appautoscaling_policy", "subscriber_backlog_per_task")
	var q metricQuery
	for _, tt := range blocksOf(p.Body, "target_tracking_scaling_policy_configuration") {
		for _, cm := range blocksOf(tt.Body, "customized_metric_specification") {
			q = metricsOf(t, m, cm.Body, "metrics")
		}
	}
	if q.expr == "" {
		t.Fatal("aws_appautoscaling_policy.subscriber_backlog_per_task has no customized metric")
	}
	for _, tc := range []struct {
		name                       string
		visible, inFlight, desired *float64
		want                       func(v float64, ok bool) bool
		says                       string
	}{
		{"a fleet that keeps up", f(0), f(40), f(2), func(v float64, ok bool) bool { return ok && v > 0 }, "above 0: tasks are busy"},
		{"a backlog", f(300), f(40), f(2), func(v float64, ok bool) bool { return ok && v == 170 }, "170 messages per task"},
		{"twice the tasks", f(300), f(40), f(4), func(v float64, ok bool) bool { return ok && v == 85 }, "85 messages per task"},
		{"an empty queue", f(0), f(0), f(2), func(v float64, ok bool) bool { return ok && v == 0 }, "0, so the service may scale in"},
		{"no task wanted yet", f(5), f(0), f(0), func(v float64, ok bool) bool { return !ok || v > 0 }, "no data point, or above 0: never 0 while messages wait"},
		{"no task count reported", f(5), f(0), nil, func(v float64, ok bool) bool { return !ok || v > 0 }, "no data point, or above 0: never 0 while messages wait"},
		{"in flight while none is wanted", f(0), f(3), f(0), func(v float64, ok bool) bool { return !ok || v > 0 }, "no data point, or above 0: never 0 while messages wait"},
	} {
		for missing, reading := range missingReadings {
			v, ok := q.eval(t, map[string]*float64{visibleMetric: tc.visible, inFlightMetric: tc.inFlight, desiredMetric: tc.desired}, missing, false)
			if !tc.want(v, ok) {
				t.Errorf("%s, %s: %q gives %v (data point: %v); want %s", tc.name, reading, q.expr, v, ok, tc.says)
			}
		}
	}
}

// CloudWatch invokes an Auto Scaling action every period its alarm stays in
// ALARM, and the from-zero alarm stays there until the new task count has
// reached CloudWatch: one waiting message could start a task per minute.
// The step policy must set an exact capacity, or hold off (its cooldown)
// until the alarm can have cleared; and one misread minute (a task count not
// yet reported, read as 0) must not fire the alarm next to a busy fleet.
func TestOneMessageStartsOneGPUTask(t *testing.T) {
	m := root(t)
	alarm := m.resource(t, "aws_cloudwatch_metric_alarm", "subscriber_backlog_without_capacity")
	q := metricsOf(t, m, alarm.Body, "metric_query")
	if op := m.attr(t, alarm, "comparison_operator", nil); !op.RawEquals(cty.StringVal("GreaterThanThreshold")) || m.number(t, alarm.Body.Attributes["threshold"].Expr, nil) != 0 {
		t.Fatalf("the from-zero alarm is not \"> 0\"; this test reads its expression as such")
	}
	for _, tc := range []struct {
		name             string
		visible, desired *float64
		breach           bool
	}{
		{"messages, no task wanted", f(3), f(0), true},
		{"messages, no task count reported", f(3), nil, true},
		{"messages, one task wanted", f(3), f(1), false},
		{"messages, a fleet", f(500), f(6), false},
		{"no messages", f(0), f(0), false},
		{"no queue data", nil, f(0), false},
	} {
		// Issue 34 item 13: the task count is missing until Container
		// Insights reports the service; the alarm must breach then whichever
		// way arithmetic reads a missing operand (FILL says which).
		for missing, reading := range missingReadings {
			v, ok := q.eval(t, map[string]*float64{visibleMetric: tc.visible, desiredMetric: tc.desired}, missing, true)
			if got := ok && v > 0; got != tc.breach {
				t.Errorf("%s, %s: %q gives %v (data point: %v): breaching %v, want %v", tc.name, reading, q.expr, v, ok, got, tc.breach)
			}
		}
	}

	periods := m.number(t, alarm.Body.Attributes["evaluation_periods"].Expr, nil)
	toAlarm := periods
	if a, ok := alarm.Body.Attributes["datapoints_to_alarm"]; ok {
		toAlarm = m.number(t, a.Expr, nil)
	}
	if toAlarm < 2 {
		t.Errorf("the from-zero alarm fires on %d data point of %d: one minute whose task count has not reached CloudWatch yet starts a GPU task", toAlarm, periods)
	}
	var period int64
	for _, mq := range blocksOf(alarm.Body, "metric_query") {
		for _, mb := range blocksOf(mq.Body, "metric") {
			period = max(period, m.number(t, mb.Body.Attributes["period"].Expr, nil))
		}
	}

	policy := ""
	for _, tr := range alarm.Body.Attributes["alarm_actions"].Expr.Variables() {
		if tr.RootName() == "aws_appautoscaling_policy" {
			policy = attrName(tr[1])
		}
	}
	if policy == "" {
		t.Fatal("the from-zero alarm triggers no scaling policy")
	}
	for _, c := range blocksOf(m.resource(t, "aws_appautoscaling_policy", policy).Body, "step_scaling_policy_configuration") {
		adjustment := m.attr(t, c, "adjustment_type", nil).AsString()
		steps := blocksOf(c.Body, "step_adjustment")
		if adjustment == "ExactCapacity" {
			for _, s := range steps {
				if n := m.number(t, s.Body.Attributes["scaling_adjustment"].Expr, nil); n != 1 {
					t.Errorf("the from-zero policy sets %d tasks", n)
				}
			}
			continue
		}
		// The alarm clears once enough data points no longer breach (all but
		// datapoints_to_alarm-1 of the window), each a period, after the new
		// desired count has reached CloudWatch (two minutes allowed for that).
		clears := (periods-toAlarm+1)*period + 120
		cooldown := int64(0)
		if a, ok := c.Body.Attributes["cooldown"]; ok {
			cooldown = m.number(t, a.Expr, nil)
		}
		if cooldown < clears {
			t.Errorf("aws_appautoscaling_policy.%s: %s with a cooldown of %ds: the alarm, which may stay in ALARM about %ds after the first task is wanted and re-invokes the policy every %ds, starts another GPU task", policy, adjustment, cooldown, clears, period)
		}
	}
}

// ---------------------------------------------------------------------------
// Item 15
// ---------------------------------------------------------------------------

// subscriberTimeouts maps the subscriber environment the module sets to the
// subscriber.Config fields its flags fill (docs/configuration.md).
var subscriberTimeouts = map[string]func(*subscriber.Config, time.Duration){
	"VRAMQ_VISIBILITY_TIMEOUT": func(c *subscriber.Config, d time.Duration) { c.Visibility = d },
	"VRAMQ_MAX_HOLD":           func(c *subscriber.Config, d time.Duration) { c.MaxHold = d },
	"VRAMQ_INFERENCE_TIMEOUT":  func(c *subscriber.Config, d time.Duration) { c.InferenceTimeout = d },
	"VRAMQ_WAIT_TIME":          func(c *subscriber.Config, d time.Duration) { c.WaitTime = d },
	"VRAMQ_SHUTDOWN_GRACE":     func(c *subscriber.Config, d time.Duration) { c.ShutdownGrace = d },
}

// Whatever the variables and the task definition's preconditions accept,
// the subscriber must start with: it refuses an inference timeout at or over
// its max hold, and a visibility timeout over it, and a task that exits at
// start is a crash loop (the subscriber's own Config.Validate decides here).
func TestTheSubscriberStartsWithWhatTheVariablesAccept(t *testing.T) {
	m := root(t)
	for _, env := range keys(subscriberTimeouts) {
		if _, ok := subscriberEnv(t, m, nil)[env]; !ok && env != "VRAMQ_MAX_HOLD" {
			t.Fatalf("the subscriber task does not set %s; this test assumes the module sets the timeouts", env)
		}
	}
	_, setsMaxHold := m.variables["subscriber_max_hold_seconds"]
	td := m.resource(t, "aws_ecs_task_definition", "subscriber")
	accepted, checked := 0, 0
	// Around the subscriber's bounds: the default max hold (900 s, -1: not
	// set), a visibility just over it, an inference timeout at it.
	for _, vis := range []int64{30, 901, 43200} {
		for _, inference := range []int64{120, 900, 3600} {
			for _, hold := range []int64{-1, 900, 3601} {
				o := map[string]cty.Value{
					"visibility_timeout_seconds":           cty.NumberIntVal(vis),
					"subscriber_inference_timeout_seconds": cty.NumberIntVal(inference),
					"subscriber_shutdown_grace_seconds":    cty.NumberIntVal(max(inference, 130)),
				}
				if hold >= 0 {
					if !setsMaxHold {
						continue
					}
					o["subscriber_max_hold_seconds"] = cty.NumberIntVal(hold)
				}
				checked++
				tfOK := allTrue(m.preconditions(t, td, o))
				for name, v := range o {
					tfOK = tfOK && m.validates(t, name, v)
				}
				if !tfOK {
					continue
				}
				accepted++
				c := subscriber.DefaultConfig()
				for name, value := range subscriberEnv(t, m, o) {
					if set, ok := subscriberTimeouts[name]; ok {
						set(&c, parseDuration(t, name, value))
					}
				}
				var refused []string
				for _, e := range flatten(c.Validate()) {
					var fe *subscriber.FieldError
					if errors.As(e, &fe) && slices.Contains([]string{"Visibility", "MaxHold", "InferenceTimeout", "AdmitTimeout", "WaitTime", "ShutdownGrace"}, fe.Field) {
						refused = append(refused, fe.Error())
					}
				}
				if len(refused) > 0 {
					t.Errorf("the module accepts %s, and the subscriber refuses to start with it: %s", settings(o), strings.Join(refused, "; "))
				}
			}
		}
	}
	if accepted == 0 || accepted == checked {
		t.Errorf("%d of %d combinations accepted: the test's grid does not reach both sides", accepted, checked)
	}
}

// settings formats variable overrides as name=value, sorted.
func settings(o map[string]cty.Value) string {
	var out []string
	for _, k := range sorted(keys(o)) {
		v := o[k]
		s := v.GoString()
		if v.IsKnown() && v.Type() == cty.Number {
			s = v.AsBigFloat().String()
		}
		out = append(out, k+"="+s)
	}
	return strings.Join(out, " ")
}

// flatten unwraps errors.Join.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// Lambda takes a synchronous invocation event of at most 6 MB (6291456
// bytes), and API Gateway may base64-encode the body into it: a body limit
// the event cannot carry means requests the publisher would take get API
// Gateway's bare 500 instead of its 413. An HTTP API takes 10 MB, so
// Lambda's limit binds.
func TestLambdaBodiesFitTheInvocationLimit(t *testing.T) {
	m := root(t)
	const lambdaEvent = 6291456
	const eventOverhead = 64 << 10 // headers (at most 10 KiB on an HTTP API), request context, JSON
	fits := func(body int64) bool { return 4*((body+2)/3)+eventOverhead <= lambdaEvent }
	fn := m.resource(t, "aws_lambda_function", "publisher")
	limit := func(o map[string]cty.Value) int64 {
		env := m.eval(t, blocksOf(fn.Body, "environment")[0].Body.Attributes["variables"].Expr, o)
		if !env.Type().HasAttribute("VRAMQ_MAX_BODY_BYTES") {
			d := documentedFlags(t, "publisher")["max-body-bytes"].def
			n, err := bytesize.Parse(d)
			if err != nil {
				t.Fatalf("the function does not set VRAMQ_MAX_BODY_BYTES, and the flag's default %q does not parse: %v", d, err)
			}
			return int64(n)
		}
		n, err := strconv.ParseInt(env.GetAttr("VRAMQ_MAX_BODY_BYTES").AsString(), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := limit(nil); !fits(n) {
		t.Errorf("lambda mode: the publisher takes bodies of up to %d bytes by default; base64 in Lambda's %d-byte event, they do not fit", n, lambdaEvent)
	}
	_, variable := m.variables["publisher_max_body_bytes"]
	if !variable {
		return
	}
	for _, n := range []int64{1 << 20, 4 << 20, 5 << 20, 8 << 20, 32 << 20} {
		o := map[string]cty.Value{"publisher_max_body_bytes": cty.NumberIntVal(n)}
		accepted := m.validates(t, "publisher_max_body_bytes", o["publisher_max_body_bytes"]) && allTrue(m.preconditions(t, fn, o))
		if accepted && !fits(limit(o)) {
			t.Errorf("lambda mode accepts publisher_max_body_bytes = %d, which Lambda's event cannot carry", n)
		}
		if n <= 1<<20 && !accepted {
			t.Errorf("lambda mode refuses publisher_max_body_bytes = %d", n)
		}
	}
	// Fargate has no such limit: a larger body limit is the user's to set.
	fargate := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate"), "publisher_max_body_bytes": cty.NumberIntVal(32 << 20)}
	if v := containerEnv(t, m, "publisher", fargate)["VRAMQ_MAX_BODY_BYTES"]; v != strconv.Itoa(32<<20) {
		t.Errorf("fargate mode, publisher_max_body_bytes = 32 MiB: the task's VRAMQ_MAX_BODY_BYTES is %q", v)
	}
}

// IAM matches a secret's complete ARN, which ends in a hyphen and six
// random characters; a policy naming a partial ARN (without them) grants
// nothing, so the keys could not be read.
func TestPartialSecretsManagerARNsAreRefused(t *testing.T) {
	m := root(t)
	for arn, want := range map[string]bool{
		"arn:aws:secretsmanager:eu-west-1:111122223333:secret:vramq-keys-AbCdEf":      true,
		"arn:aws:secretsmanager:eu-west-1:111122223333:secret:prod/vramq/keys-a1B2c3": true,
		"arn:aws:ssm:eu-west-1:111122223333:parameter/vramq/keys":                     true,
		"arn:aws:secretsmanager:eu-west-1:111122223333:secret:vramq-keys":             false,
		"arn:aws:secretsmanager:eu-west-1:111122223333:secret:vramqkeys":              false,
		"vramq-keys": false,
	} {
		if got := m.validates(t, "publisher_api_keys_secret_arn", cty.StringVal(arn)); got != want {
			t.Errorf("publisher_api_keys_secret_arn = %s: accepted %v, want %v", arn, got, want)
		}
	}
}

// The publisher's 500s and 503s are responses, which Lambda counts as
// successful invocations: only API Gateway's (or the load balancer's) 5xx
// count says clients are failing.
func TestThe5xxAnswersRaiseAnAlarm(t *testing.T) {
	m := root(t)
	found := map[string]bool{}
	for name, a := range m.resourcesOf("aws_cloudwatch_metric_alarm") {
		var metrics []*hclsyntax.Block
		if _, ok := a.Body.Attributes["metric_name"]; ok {
			metrics = append(metrics, a)
		}
		for _, q := range blocksOf(a.Body, "metric_query") {
			metrics = append(metrics, blocksOf(q.Body, "metric")...)
		}
		for _, mb := range metrics {
			ns, metric := m.attr(t, mb, "namespace", nil), m.attr(t, mb, "metric_name", nil)
			if !ns.IsKnown() || !metric.IsKnown() || ns.IsNull() || metric.IsNull() {
				continue
			}
			dims, _ := mb.Body.Attributes["dimensions"].Expr.(*hclsyntax.ObjectConsExpr)
			switch key := ns.AsString() + " " + metric.AsString(); {
			case key == "AWS/ApiGateway 5xx" && refersTo(m.itemExpr(dims, "ApiId"), "aws_apigatewayv2_api", "publisher"):
				found["lambda"] = true
			case key == "AWS/ApplicationELB HTTPCode_Target_5XX_Count" && refersTo(m.itemExpr(dims, "LoadBalancer"), "aws_lb", "publisher"):
				found["fargate"] = true
			case strings.Contains(strings.ToLower(key), "5xx"):
				t.Logf("aws_cloudwatch_metric_alarm.%s watches %s", name, key)
			}
		}
	}
	if !found["lambda"] {
		t.Error("lambda mode: no alarm on the HTTP API's 5xx metric (AWS/ApiGateway, \"5xx\", by ApiId)")
	}
	if !found["fargate"] {
		t.Error("fargate mode: no alarm on the publisher targets' HTTPCode_Target_5XX_Count")
	}
}

// Availability Zone rebalancing stops running tasks to start them in
// another zone: for a GPU task, a batch cut short and a cold start.
func TestTheGPUServiceIsNotRebalanced(t *testing.T) {
	m := root(t)
	if v := m.attr(t, m.resource(t, "aws_ecs_service", "subscriber"), "availability_zone_rebalancing", nil); !v.RawEquals(cty.StringVal("DISABLED")) {
		t.Errorf("aws_ecs_service.subscriber: availability_zone_rebalancing = %#v, want \"DISABLED\" (unset is ECS's default, which may be ENABLED)", v)
	}
}

// for_each keys must be known at plan time; a list of ids from resources
// created in the same apply (subnets, say) is known only in length, and
// for_each = toset(var.ids) then fails to plan.
func TestForEachKeysAreKnownAtPlan(t *testing.T) {
	for _, m := range modules(t) {
		o := map[string]cty.Value{"publisher_mode": cty.StringVal("fargate"), "completion_events": cty.True}
		for name, v := range m.variables {
			if typ, ok := v.Body.Attributes["type"].Expr.(*hclsyntax.FunctionCallExpr); ok && typ.Name == "list" && len(typ.Args) == 1 && hcl.ExprAsKeyword(typ.Args[0]) == "string" {
				o[name] = cty.ListVal([]cty.Value{cty.UnknownVal(cty.String), cty.UnknownVal(cty.String)})
			}
		}
		for _, set := range []map[string]*hclsyntax.Block{m.resources, m.data} {
			for name, b := range set {
				a, ok := b.Body.Attributes["for_each"]
				if !ok {
					continue
				}
				v := m.eval(t, a.Expr, o)
				keysKnown := v.IsKnown()
				if keysKnown && v.Type().IsSetType() {
					keysKnown = v.IsWhollyKnown()
				}
				if !keysKnown {
					t.Errorf("%s: %s: for_each's keys are not known at plan time when list variables hold ids known only after apply (%#v)", m.dir, name, v)
				}
			}
		}
	}
}

// A new AMI is a new launch template version: without an instance refresh
// running instances keep the old one until scaled in, and ECS's managed
// termination protection marks every instance with a task protected from
// scale-in, which a refresh skips unless told to replace them.
func TestANewAMIReachesRunningInstances(t *testing.T) {
	m := root(t)
	asg := m.resource(t, "aws_autoscaling_group", "gpu")
	refresh := blocksOf(asg.Body, "instance_refresh")
	if len(refresh) != 1 {
		t.Fatal("aws_autoscaling_group.gpu has no instance_refresh: a new subscriber_ami_id reaches no running instance")
	}
	if s := m.attr(t, refresh[0], "strategy", nil); !s.RawEquals(cty.StringVal("Rolling")) {
		t.Errorf("instance_refresh strategy %#v", s)
	}
	if p := m.attr(t, asg, "protect_from_scale_in", nil); p.IsKnown() && !p.IsNull() && p.True() {
		protected := cty.NullVal(cty.String)
		for _, pr := range blocksOf(refresh[0].Body, "preferences") {
			protected = m.attr(t, pr, "scale_in_protected_instances", nil)
		}
		if !protected.RawEquals(cty.StringVal("Refresh")) {
			t.Errorf("the group's instances are protected from scale-in, and the refresh's scale_in_protected_instances is %#v: instances running a task are never replaced (want \"Refresh\"; managed draining stops their tasks first)", protected)
		}
	}
	draining := cty.NullVal(cty.String)
	for _, p := range blocksOf(m.resource(t, "aws_ecs_capacity_provider", "gpu").Body, "auto_scaling_group_provider") {
		draining = m.attr(t, p, "managed_draining", nil)
	}
	if !draining.RawEquals(cty.StringVal("ENABLED")) {
		t.Errorf("the capacity provider's managed_draining is %#v: the tasks of instances the refresh terminates are not stopped first", draining)
	}
}

// The values the provider takes for the enumerated arguments used here,
// checked without a provider (the mirror's terraform validate checks them
// too, where there is one): a treat_missing_data of "notBreachin" is an
// alarm that never plans.
func TestEnumeratedArgumentsTakeKnownValues(t *testing.T) {
	allowed := map[string][]string{
		"treat_missing_data":             {"breaching", "notBreaching", "ignore", "missing"},
		"comparison_operator":            {"GreaterThanOrEqualToThreshold", "GreaterThanThreshold", "LessThanThreshold", "LessThanOrEqualToThreshold", "LessThanLowerOrGreaterThanUpperThreshold", "LessThanLowerThreshold", "GreaterThanUpperThreshold"},
		"statistic":                      {"SampleCount", "Average", "Sum", "Minimum", "Maximum"},
		"adjustment_type":                {"ChangeInCapacity", "ExactCapacity", "PercentChangeInCapacity"},
		"metric_aggregation_type":        {"Minimum", "Maximum", "Average"},
		"availability_zone_rebalancing":  {"ENABLED", "DISABLED"},
		"managed_draining":               {"ENABLED", "DISABLED"},
		"managed_termination_protection": {"ENABLED", "DISABLED"},
		"scale_in_protected_instances":   {"Refresh", "Ignore", "Wait"},
		"policy_type":                    {"TargetTrackingScaling", "StepScaling", "PredictiveScaling"},
	}
	seen := 0
	for _, m := range modules(t) {
		for _, body := range m.bodies {
			_ = hclsyntax.VisitAll(body, func(n hclsyntax.Node) hcl.Diagnostics {
				a, ok := n.(*hclsyntax.Attribute)
				if !ok || allowed[a.Name] == nil {
					return nil
				}
				v, diags := a.Expr.Value(nil)
				if diags.HasErrors() || !v.IsKnown() || v.Type() != cty.String {
					return nil // built from variables: their validations say
				}
				seen++
				if !slices.Contains(allowed[a.Name], v.AsString()) {
					t.Errorf("%s: %s = %q, not one of %v", a.SrcRange, a.Name, v.AsString(), allowed[a.Name])
				}
				return nil
			})
		}
	}
	if seen < 10 {
		t.Errorf("only %d enumerated arguments found", seen)
	}
}
