package infra_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// goStrings returns what the string literal expression e (literals joined
// by +) spells, and false for anything else.
func goStrings(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		x, ok1 := goStrings(e.X)
		y, ok2 := goStrings(e.Y)
		return x + y, ok1 && ok2 && e.Op == token.ADD
	case *ast.ParenExpr:
		return goStrings(e.X)
	}
	return "", false
}

// loggedAt returns the messages that the non-test Go files of dir pass as
// the first argument of a call of .<level> on a .log (s.log.Error(...)).
func loggedAt(t *testing.T, dir, level string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != level {
				return true
			}
			if recv, ok := sel.X.(*ast.SelectorExpr); !ok || recv.Sel.Name != "log" {
				return true
			}
			if msg, ok := goStrings(call.Args[0]); ok {
				out = append(out, msg)
			}
			return true
		})
	}
	return out
}

// Issue 34 item 11: a subscriber whose model needs an operator must stay
// up (ECS replacing it hands the same messages round again, a receive
// each, until good ones are dead-lettered), so its container health check
// is liveness, which ignores that state; and since nothing then replaces
// or flags the task, the state must raise an alarm, as OOM retries do: a
// metric filter on the line the subscriber logs when it stops, and an
// alarm on that metric that notifies.
func TestTheOperatorStateRaisesAnAlarmNotAReplacement(t *testing.T) {
	m := root(t)

	// The health check: the binary's own healthcheck, which asks /livez.
	def := m.eval(t, m.variables["subscriber_health_check_command"].Body.Attributes["default"].Expr, nil)
	var args []string
	for _, v := range def.AsValueSlice() {
		args = append(args, v.AsString())
	}
	if !slices.Contains(args, "healthcheck") {
		t.Errorf("subscriber_health_check_command's default %q is not `subscriber healthcheck`", args)
	}
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "cmd", "subscriber", "main.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var asks []string
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "healthcheck" {
			ast.Inspect(fn, func(n ast.Node) bool {
				if s, ok := goStrings(asExpr(n)); ok && strings.HasPrefix(s, "/") {
					asks = append(asks, s)
				}
				return true
			})
		}
	}
	if !slices.Equal(asks, []string{"/livez"}) {
		t.Errorf("cmd/subscriber's healthcheck asks %q; want the liveness endpoint, /livez, alone: ECS replaces a task whose check fails", asks)
	}

	// The metric filter counts a line the subscriber logs at ERROR.
	local, ok := m.locals["operator_log_message"]
	if !ok {
		t.Fatal("no local.operator_log_message: nothing counts the line the subscriber logs when it stops for an operator")
	}
	msg := m.eval(t, local.Expr, nil)
	if !msg.IsKnown() || msg.IsNull() {
		t.Fatal("local.operator_log_message is not known")
	}
	if errs := loggedAt(t, filepath.Join("..", "subscriber"), "Error"); !slices.Contains(errs, msg.AsString()) {
		t.Errorf("the operator metric filter counts %q, which package subscriber does not log at ERROR (it logs %q)", msg.AsString(), errs)
	}
	var filter string
	for name, b := range m.resourcesOf("aws_cloudwatch_log_metric_filter") {
		if refersTo(b.Body.Attributes["pattern"].Expr, "local", "operator_log_message") &&
			refersTo(b.Body.Attributes["log_group_name"].Expr, "aws_cloudwatch_log_group", "subscriber") {
			filter = name
			p := m.attr(t, b, "pattern", nil)
			if p.IsKnown() && !strings.Contains(p.AsString(), `$.level = "ERROR"`) {
				t.Errorf("aws_cloudwatch_log_metric_filter.%s: %q does not match the line's level, ERROR", name, p.AsString())
			}
		}
	}
	if filter == "" {
		t.Fatal("no metric filter on the subscriber's log group counts local.operator_log_message")
	}
	alarmed := false
	for name, b := range m.resourcesOf("aws_cloudwatch_metric_alarm") {
		a, ok := b.Body.Attributes["metric_name"]
		if !ok || !refersTo(a.Expr, "aws_cloudwatch_log_metric_filter", filter) {
			continue
		}
		alarmed = true
		if !refersTo(b.Body.Attributes["alarm_actions"].Expr, "local", "alarm_actions") {
			t.Errorf("aws_cloudwatch_metric_alarm.%s notifies nobody", name)
		}
		if op := m.attr(t, b, "comparison_operator", nil).AsString(); op != "GreaterThanThreshold" || m.number(t, b.Body.Attributes["threshold"].Expr, nil) != 0 {
			t.Errorf("aws_cloudwatch_metric_alarm.%s: %s its threshold; want > 0, one stopped subscriber", name, op)
		}
	}
	if !alarmed {
		t.Errorf("no alarm on aws_cloudwatch_log_metric_filter.%s", filter)
	}
}

// asExpr is n as an expression, or nil.
func asExpr(n ast.Node) ast.Expr {
	e, _ := n.(ast.Expr)
	return e
}
