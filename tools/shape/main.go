// Command shape reports the shape of Sturdy's code, for a redesign's
// before and after: product lines per package, the largest structs (with
// their same-package parts), the state one request carries, the
// upstream seam's width, the types whose methods spread over more
// than four files, the functions over 60 lines, and the file-level call
// cycles inside each package.
//
//	go run ./tools/shape                 # every package of the module
//	go run ./tools/shape ./proxy ./policy
//	go run ./tools/shape -struct proxy.exchange
//
// It type-checks from the compiler's export data (go list -export), so
// a call is attributed to the file that declares the function or method
// it calls. A function whose doc comment holds a line "shape:long <why>"
// (a flat registration list, a decision table) is listed apart. Its tests
// hold the shape of the request path: no file-level cycle in proxy, no
// type's methods over four files and no function over 60 lines in
// proxy, policy and events, the proxy's loop, response and rescue
// telling the metrics and the trace only through the request's report,
// the fields one request carries (every struct proxy.exchange reaches,
// by value or pointer, shared ones aside) and how much of package
// upstream proxy uses, each under a ceiling.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// maxFuncLines is the longest a product function may be (shape:long
// excepted); maxMethodFiles the most files a type's methods may span.
const (
	maxFuncLines   = 60
	maxMethodFiles = 4
)

func main() {
	structName := flag.String("struct", "proxy.exchange", "pkg.Type: the per-request struct whose fields (and same-package parts) are counted")
	top := flag.Int("top", 10, "how many of the largest structs and longest functions to list")
	flag.Parse()
	patterns := flag.Args()
	if len(patterns) == 0 {
		patterns = []string{"./..."}
	}
	if err := run(os.Stdout, patterns, *structName, *top); err != nil {
		fmt.Fprintln(os.Stderr, "shape:", err)
		os.Exit(1)
	}
}

// listed is what go list says of a package.
type listed struct {
	ImportPath string
	Name       string
	Dir        string
	GoFiles    []string
	Export     string
	Standard   bool
	DepOnly    bool
}

// golist lists the packages of patterns and their dependencies with
// their export data.
func golist(patterns []string) ([]listed, error) {
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-json=ImportPath,Name,Dir,GoFiles,Export,Standard,DepOnly"}, patterns...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

// pkg is one package of the module, parsed and checked.
type pkg struct {
	path  string
	short string // the path within the module
	fset  *token.FileSet
	files []*ast.File
	info  *types.Info
	tpkg  *types.Package
	lines int
}

func run(w io.Writer, patterns []string, structName string, top int) error {
	pkgs, err := load(patterns)
	if err != nil {
		return err
	}
	reportLines(w, pkgs)
	reportStructs(w, pkgs, structName, top)
	reportRequest(w, pkgs)
	reportMethods(w, pkgs)
	reportFuncs(w, pkgs, top)
	reportCycles(w, pkgs)
	return nil
}

// load lists, parses and type-checks the packages of patterns (not
// their dependencies), sorted by name.
func load(patterns []string) ([]*pkg, error) {
	all, err := golist(patterns)
	if err != nil {
		return nil, err
	}
	exports := map[string]string{}
	module := ""
	for _, p := range all {
		exports[p.ImportPath] = p.Export
		if !p.DepOnly && module == "" {
			module = strings.Split(p.ImportPath, "/")[0]
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f := exports[path]
		if f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	var pkgs []*pkg
	for _, l := range all {
		if l.DepOnly || l.Standard || len(l.GoFiles) == 0 {
			continue
		}
		p, err := check(fset, imp, l, module)
		if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].short < pkgs[j].short })
	return pkgs, nil
}

// check parses and type-checks one package.
func check(fset *token.FileSet, imp types.Importer, l listed, module string) (*pkg, error) {
	p := &pkg{path: l.ImportPath, short: strings.TrimPrefix(strings.TrimPrefix(l.ImportPath, module), "/"), fset: fset}
	if p.short == "" {
		p.short = "."
	}
	for _, name := range l.GoFiles {
		path := filepath.Join(l.Dir, name)
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		p.files = append(p.files, f)
		p.lines += fset.File(f.Pos()).LineCount()
	}
	p.info = &types.Info{Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{}, Types: map[ast.Expr]types.TypeAndValue{}}
	conf := types.Config{Importer: imp}
	var err error
	if p.tpkg, err = conf.Check(l.ImportPath, fset, p.files, p.info); err != nil {
		return nil, fmt.Errorf("%s: %w", l.ImportPath, err)
	}
	return p, nil
}

// fileOf is the base name of the file pos is in.
func (p *pkg) fileOf(pos token.Pos) string { return filepath.Base(p.fset.Position(pos).Filename) }

func reportLines(w io.Writer, pkgs []*pkg) {
	total := 0
	for _, p := range pkgs {
		total += p.lines
	}
	fmt.Fprintf(w, "## Product lines per package (%d in all, tests excluded)\n\n| package | files | lines | share |\n|---|---:|---:|---:|\n", total)
	for _, p := range pkgs {
		fmt.Fprintf(w, "| %s | %d | %d | %.0f %% |\n", p.short, len(p.files), p.lines, 100*float64(p.lines)/float64(max(total, 1)))
	}
	fmt.Fprintln(w)
}

// fieldCount counts a struct's fields, and those of the same-package
// named structs it holds by value (its parts), once each.
func fieldCount(s *types.Struct, home *types.Package, seen map[*types.Named]bool, parts *[]string) int {
	n := 0
	for i := 0; i < s.NumFields(); i++ {
		f := s.Field(i)
		n++
		named, ok := f.Type().(*types.Named)
		if !ok || named.Obj().Pkg() != home || seen[named] {
			continue
		}
		if inner, ok := named.Underlying().(*types.Struct); ok {
			seen[named] = true
			k := fieldCount(inner, home, seen, parts)
			*parts = append(*parts, fmt.Sprintf("%s %d", named.Obj().Name(), k))
			n += k
		}
	}
	return n
}

func reportStructs(w io.Writer, pkgs []*pkg, structName string, top int) {
	type row struct {
		name  string
		own   int
		total int
		parts []string
	}
	var rows []row
	var focus *row
	for _, p := range pkgs {
		scope := p.tpkg.Scope()
		for _, name := range scope.Names() {
			tn, ok := scope.Lookup(name).(*types.TypeName)
			if !ok {
				continue
			}
			s, ok := tn.Type().Underlying().(*types.Struct)
			if !ok {
				continue
			}
			var parts []string
			r := row{name: p.short + "." + name, own: s.NumFields()}
			r.total = fieldCount(s, p.tpkg, map[*types.Named]bool{}, &parts)
			r.parts = parts
			rows = append(rows, r)
			if r.name == structName || p.tpkg.Name()+"."+name == structName {
				rr := r
				focus = &rr
			}
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].total > rows[j].total })
	fmt.Fprintf(w, "## Largest structs (fields, with same-package parts held by value)\n\n")
	if focus != nil {
		fmt.Fprintf(w, "The per-request struct %s: **%d fields** (%d of its own", focus.name, focus.total, focus.own)
		if len(focus.parts) > 0 {
			fmt.Fprintf(w, "; parts: %s", strings.Join(focus.parts, ", "))
		}
		fmt.Fprintf(w, ").\n\n")
	}
	fmt.Fprintf(w, "| struct | own fields | with parts |\n|---|---:|---:|\n")
	for i, r := range rows {
		if i >= top {
			break
		}
		fmt.Fprintf(w, "| %s | %d | %d |\n", r.name, r.own, r.total)
	}
	fmt.Fprintln(w)
}

// requestRoot is the per-request struct of the request path, and
// requestShared the types it points at that outlive it: the proxy, a
// configuration's table, route and targets, a key's settings and spend, the fleet
// link.
// Their fields are not the request's; what hangs off them is not walked.
const requestRoot = "exchange"

var requestShared = map[string]bool{"Proxy": true, "table": true, "route": true, "target": true, "clientKey": true, "spent": true, "shared": true}

// typeFields is a struct type the request reaches and its own fields.
type typeFields struct {
	name   string
	fields int
	via    string // the field that first reached it, and how (value, pointer, slice, array)
}

// requestFields walks every same-package struct reachable from the
// request's root by value, pointer, slice, array, map or channel, and
// through named types of those, stopping at the shared types. It counts
// each struct type's own fields once: the state one request carries,
// pooled parts included.
func requestFields(p *pkg) (total int, reached []typeFields) {
	root, ok := p.tpkg.Scope().Lookup(requestRoot).(*types.TypeName)
	if !ok {
		return 0, nil
	}
	seen := map[*types.Named]bool{}
	var walk func(n *types.Named, via string)
	walk = func(n *types.Named, via string) {
		s, ok := n.Underlying().(*types.Struct)
		if !ok || seen[n] || requestShared[n.Obj().Name()] {
			return
		}
		seen[n] = true
		reached = append(reached, typeFields{n.Obj().Name(), s.NumFields(), via})
		total += s.NumFields()
		for i := 0; i < s.NumFields(); i++ {
			f := s.Field(i)
			for _, r := range reaches(f.Type(), "value", p.tpkg, 0) {
				walk(r.named, n.Obj().Name()+"."+f.Name()+" ("+r.how+")")
			}
		}
	}
	walk(root.Type().(*types.Named), "the request")
	return total, reached
}

// reach is a same-package struct a field's type leads to, and how.
type reach struct {
	named *types.Named
	how   string
}

// reaches is every same-package struct type t leads to: itself, or what
// it points at, holds in a slice, array, map (keys and values) or
// channel, or is made of as a named type of those (depth-bounded).
func reaches(t types.Type, how string, home *types.Package, depth int) []reach {
	if depth > 8 {
		return nil
	}
	switch x := types.Unalias(t).(type) {
	case *types.Pointer:
		return reaches(x.Elem(), "pointer", home, depth+1)
	case *types.Slice:
		return reaches(x.Elem(), "slice", home, depth+1)
	case *types.Array:
		return reaches(x.Elem(), "array", home, depth+1)
	case *types.Chan:
		return reaches(x.Elem(), "channel", home, depth+1)
	case *types.Map:
		return append(reaches(x.Key(), "map", home, depth+1), reaches(x.Elem(), "map", home, depth+1)...)
	case *types.Named:
		if x.Obj().Pkg() != home {
			return nil
		}
		if _, ok := x.Underlying().(*types.Struct); ok {
			return []reach{{x, how}}
		}
		return reaches(x.Underlying(), how, home, depth+1) // a named slice, map … of the package's structs
	}
	return nil
}

// seamNames is every exported name of package from that package user
// refers to (types, functions, methods, fields, constants), sorted: the
// width of the seam between them.
func seamNames(user *pkg, from string) []string {
	names := map[string]bool{}
	for _, obj := range user.info.Uses {
		if obj.Pkg() == nil || obj.Pkg().Path() != from || !obj.Exported() {
			continue
		}
		name := obj.Name()
		if v, ok := obj.(*types.Var); ok && v.IsField() || isMethod(obj) {
			name = "." + name // a field or method, by its name
		}
		names[name] = true
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// splitSeam parts seamNames' list into package-level names and members
// (methods and fields, written ".Name").
func splitSeam(names []string) (top, members []string) {
	for _, n := range names {
		if strings.HasPrefix(n, ".") {
			members = append(members, n)
		} else {
			top = append(top, n)
		}
	}
	return top, members
}

func isMethod(obj types.Object) bool {
	f, ok := obj.(*types.Func)
	if !ok {
		return false
	}
	sig, _ := f.Type().(*types.Signature)
	return sig != nil && sig.Recv() != nil
}

// reportRequest lists the state one request carries in proxy: every
// struct reachable from its root, shared ones aside.
func reportRequest(w io.Writer, pkgs []*pkg) {
	for _, p := range pkgs {
		if p.short != "proxy" {
			continue
		}
		if names := seamNames(p, "sturdy/upstream"); len(names) > 0 {
			top, members := splitSeam(names)
			fmt.Fprintf(w, "## The upstream seam\n\nproxy uses **%d** of upstream's package-level names and %d of their "+
				"methods and fields: %s; %s.\n\n", len(top), len(members), strings.Join(top, ", "), strings.Join(members, ", "))
		}
		total, reached := requestFields(p)
		fmt.Fprintf(w, "## Per-request state (proxy.%s and every struct it reaches, shared ones aside)\n\n", requestRoot)
		fmt.Fprintf(w, "**%d fields** in %d types.\n\n| type | fields | reached through |\n|---|---:|---|\n", total, len(reached))
		for _, r := range reached {
			fmt.Fprintf(w, "| %s | %d | %s |\n", r.name, r.fields, r.via)
		}
		fmt.Fprintln(w)
	}
}

func reportMethods(w io.Writer, pkgs []*pkg) {
	type row struct {
		name           string
		methods, files int
		noParams       int
	}
	var rows []row
	for _, p := range pkgs {
		byType := map[string]map[string]bool{}
		count, noParams := map[string]int{}, map[string]int{}
		for _, f := range p.files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Recv == nil || len(fd.Recv.List) == 0 {
					continue
				}
				t := recvName(fd.Recv.List[0].Type)
				if byType[t] == nil {
					byType[t] = map[string]bool{}
				}
				byType[t][p.fileOf(fd.Pos())] = true
				count[t]++
				if fd.Type.Params.NumFields() == 0 {
					noParams[t]++
				}
			}
		}
		for t, files := range byType {
			if len(files) > maxMethodFiles {
				rows = append(rows, row{p.short + "." + t, count[t], len(files), noParams[t]})
			}
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].files > rows[j].files })
	fmt.Fprintf(w, "## Types whose methods span more than %d files\n\n", maxMethodFiles)
	if len(rows) == 0 {
		fmt.Fprintf(w, "None.\n\n")
		return
	}
	fmt.Fprintf(w, "| type | methods | files | without parameters |\n|---|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %d | %d | %d |\n", r.name, r.methods, r.files, r.noParams)
	}
	fmt.Fprintln(w)
}

// recvName is a receiver's type name (without a pointer or type
// parameters).
func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

// exempt reports whether a function's doc comment says it is long by
// design ("shape:long <why>").
func exempt(fd *ast.FuncDecl) (string, bool) {
	if fd.Doc == nil {
		return "", false
	}
	sc := bufio.NewScanner(strings.NewReader(fd.Doc.Text()))
	for sc.Scan() {
		if why, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "shape:long"); ok {
			return strings.TrimSpace(why), true
		}
	}
	return "", false
}

func reportFuncs(w io.Writer, pkgs []*pkg, top int) {
	type row struct {
		name, file, why string
		lines           int
		exempt          bool
	}
	var rows []row
	for _, p := range pkgs {
		for _, f := range p.files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				n := p.fset.Position(fd.End()).Line - p.fset.Position(fd.Pos()).Line + 1
				name := fd.Name.Name
				if fd.Recv != nil && len(fd.Recv.List) > 0 {
					name = recvName(fd.Recv.List[0].Type) + "." + name
				}
				why, ex := exempt(fd)
				rows = append(rows, row{p.short + "." + name, p.short + "/" + p.fileOf(fd.Pos()), why, n, ex})
			}
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].lines > rows[j].lines })
	fmt.Fprintf(w, "## Longest functions (over %d lines are listed; %d longest otherwise)\n\n| function | file | lines | |\n|---|---|---:|---|\n", maxFuncLines, top)
	over := 0
	for i, r := range rows {
		if r.lines <= maxFuncLines && i >= top {
			break
		}
		note := ""
		switch {
		case r.exempt:
			note = "long by design: " + r.why
		case r.lines > maxFuncLines:
			note = "**over**"
			over++
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s |\n", r.name, r.file, r.lines, note)
	}
	fmt.Fprintf(w, "\n%d over %d lines, not marked long by design.\n\n", over, maxFuncLines)
}

// callGraph is, per file of a package, the files whose functions and
// methods its code calls (or takes as values).
func callGraph(p *pkg) map[string]map[string]bool {
	g := map[string]map[string]bool{}
	for _, f := range p.files {
		from := p.fileOf(f.Pos())
		if g[from] == nil {
			g[from] = map[string]bool{}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			fn, ok := p.info.Uses[id].(*types.Func)
			if !ok || fn.Pkg() != p.tpkg {
				return true
			}
			if sig, ok := fn.Type().(*types.Signature); ok && sig.Recv() != nil {
				if _, iface := sig.Recv().Type().Underlying().(*types.Interface); iface {
					return true // an interface method: no file of its own
				}
			}
			to := p.fileOf(fn.Origin().Pos())
			if to != from {
				g[from][to] = true
			}
			return true
		})
	}
	return g
}

// cycles returns the strongly connected components of more than one file
// (Tarjan), each sorted, largest first.
func cycles(g map[string]map[string]bool) [][]string {
	index, low, on := map[string]int{}, map[string]int{}, map[string]bool{}
	var stack []string
	var out [][]string
	next := 0
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		on[v] = true
		for u := range g[v] {
			if _, seen := index[u]; !seen {
				visit(u)
				low[v] = min(low[v], low[u])
			} else if on[u] {
				low[v] = min(low[v], index[u])
			}
		}
		if low[v] == index[v] {
			var comp []string
			for {
				u := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[u] = false
				comp = append(comp, u)
				if u == v {
					break
				}
			}
			if len(comp) > 1 {
				sort.Strings(comp)
				out = append(out, comp)
			}
		}
	}
	var nodes []string
	for v := range g {
		nodes = append(nodes, v)
	}
	sort.Strings(nodes)
	for _, v := range nodes {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func reportCycles(w io.Writer, pkgs []*pkg) {
	fmt.Fprintf(w, "## File-level call cycles per package\n\n")
	any := false
	for _, p := range pkgs {
		g := callGraph(p)
		for _, c := range cycles(g) {
			any = true
			var pairs []string
			for _, a := range c {
				for _, b := range c {
					if a < b && g[a][b] && g[b][a] {
						pairs = append(pairs, strings.TrimSuffix(a, ".go")+"↔"+strings.TrimSuffix(b, ".go"))
					}
				}
			}
			fmt.Fprintf(w, "- %s: %d files call each other round: %s; both ways: %s\n", p.short, len(c), strings.Join(c, ", "),
				strings.Join(pairs, " "))
		}
	}
	if !any {
		fmt.Fprintf(w, "None.\n")
	}
	fmt.Fprintln(w)
}
