//go:build ignore

// fiximports is relayout/gpu.sh's import fixer: for each Go file named on
// the command line it adds the imports of the managed packages (-pkg
// name=path, repeated) that the file now uses as name.X, removes those it
// no longer uses, and gofmts the file. It touches no other import, so it
// is safe to run on any tree, any number of times. Usage:
//
//	go run relayout/fiximports.go -pkg bytesize=github.com/vramq/vramq/internal/bytesize ... FILE...
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

type pkgs map[string]string // name -> import path

func (p pkgs) String() string { return fmt.Sprint(map[string]string(p)) }

func (p pkgs) Set(s string) error {
	name, ip, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("want name=path, got %q", s)
	}
	p[name] = ip
	return nil
}

func main() {
	managed := pkgs{}
	flag.Var(managed, "pkg", "name=importpath of a managed package (repeatable)")
	flag.Parse()
	failed := false
	for _, file := range flag.Args() {
		// Adding and removing are two passes, so that their edits never
		// overlap.
		err := fix(file, managed, true)
		if err == nil {
			err = fix(file, managed, false)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "fiximports:", err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

type edit struct {
	at, end int // replace src[at:end]
	text    string
}

func fix(file string, managed pkgs, adding bool) error {
	src, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.ParseComments)
	if err != nil {
		return err
	}
	// The managed names used as a package qualifier: name.X with name not
	// declared in the file (a local variable of that name resolves).
	used := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Obj == nil {
				if _, ok := managed[id.Name]; ok {
					used[id.Name] = true
				}
			}
		}
		return true
	})
	off := func(p token.Pos) int { return fset.Position(p).Offset }
	present := map[string]bool{}
	var edits []edit
	anchor := -1 // where to add an import: after the project's last import, else the last import
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.IMPORT {
			continue
		}
		for _, spec := range gd.Specs {
			is := spec.(*ast.ImportSpec)
			ip, _ := strconv.Unquote(is.Path.Value)
			name := path.Base(ip)
			if is.Name != nil {
				name = is.Name.Name
			}
			if gd.Lparen.IsValid() && (anchor < 0 || strings.HasPrefix(ip, "github.com/vramq/vramq")) {
				anchor = off(is.End())
			}
			if managed[name] != ip {
				continue
			}
			present[name] = true
			if used[name] || adding {
				continue
			}
			if !gd.Lparen.IsValid() { // import "x": drop the declaration
				edits = append(edits, edit{off(gd.Pos()), off(gd.End()), ""})
			} else { // the spec's whole line
				at, end := off(is.Pos()), off(is.End())
				for at > 0 && (src[at-1] == '\t' || src[at-1] == ' ') {
					at--
				}
				if end < len(src) && src[end] == '\n' {
					end++
				}
				edits = append(edits, edit{at, end, ""})
			}
		}
	}
	var add []string
	for name := range used {
		if !present[name] {
			add = append(add, strconv.Quote(managed[name]))
		}
	}
	slices.Sort(add)
	if len(add) > 0 && adding {
		if anchor >= 0 {
			edits = append(edits, edit{anchor, anchor, "\n\t" + strings.Join(add, "\n\t")})
		} else {
			at := off(f.Name.End())
			edits = append(edits, edit{at, at, "\n\nimport (\n\t" + strings.Join(add, "\n\t") + "\n)"})
		}
	}
	if len(edits) == 0 {
		return nil
	}
	slices.SortFunc(edits, func(a, b edit) int { return b.at - a.at })
	out := slices.Clone(src)
	for _, e := range edits {
		out = slices.Concat(out[:e.at], []byte(e.text), out[e.end:])
	}
	formatted, err := format.Source(out)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return os.WriteFile(file, formatted, 0o644)
}
