package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"

	"sturdy/config"
)

// Key is one YAML key of the configuration.
type Key struct {
	// Path is the key's place in a file: parent.key, list[].key, and
	// map.<name>.key for a map of structs (upstreams[].timeouts.connect).
	Path string
	// Doc is what the doc comment of the key's field says.
	Doc Doc
	// Leaf says the value is written whole: no keys under it.
	Leaf bool
}

// mapPlaceholders name a map's keys in the paths under it; a map not
// listed gets "<name>".
var mapPlaceholders = map[string]string{"prices": "<model>"}

// unmarshaler is the interface of a type decoding itself.
var unmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

// walker walks the config types, parsing each package's source once.
type walker struct {
	root, module string
	fset         *token.FileSet
	// structs are the struct types declared in each package parsed, by
	// import path and name.
	structs map[string]map[string]*ast.StructType
	keys    []Key
}

// collect returns every key of config.Config, in field order.
func collect(root string) ([]Key, error) {
	module, err := modulePath(root)
	if err != nil {
		return nil, err
	}
	w := &walker{root: root, module: module, fset: token.NewFileSet(), structs: map[string]map[string]*ast.StructType{}}
	t := reflect.TypeFor[config.Config]()
	st, err := w.structOf(t, nil)
	if err != nil {
		return nil, err
	}
	if err := w.fields(t, st, ""); err != nil {
		return nil, err
	}
	return w.keys, nil
}

// modulePath reads the module's path from root's go.mod.
func modulePath(root string) (string, error) {
	f, err := os.Open(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", fmt.Errorf("%s: no module line", f.Name())
}

// fields adds the keys of struct t, whose source is st, under prefix.
func (w *walker) fields(t reflect.Type, st *ast.StructType, prefix string) error {
	src := map[string]*ast.Field{}
	for _, f := range st.Fields.List {
		for _, n := range f.Names {
			src[n.Name] = f
		}
		if len(f.Names) == 0 {
			src[embeddedName(f.Type)] = f
		}
	}
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		f := src[sf.Name]
		if f == nil {
			return fmt.Errorf("%s.%s: field %s is not in its source", t.PkgPath(), t.Name(), sf.Name)
		}
		if hasOption(opts, "inline") {
			ft := sf.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			st, err := w.structOf(ft, unstar(f.Type))
			if err != nil {
				return err
			}
			if err := w.fields(ft, st, prefix); err != nil {
				return err
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(sf.Name) // yaml's own default
		}
		if err := w.value(sf.Type, f.Type, prefix+name, parseDoc(sf.Name, docText(f))); err != nil {
			return err
		}
	}
	return nil
}

// value adds the key at path, of type t written as expr, and the keys
// under it.
func (w *walker) value(t reflect.Type, expr ast.Expr, path string, doc Doc) error {
	if t.Kind() == reflect.Pointer && !w.leaf(t) {
		t, expr = t.Elem(), unstar(expr)
	}
	var under reflect.Type // the struct whose keys come under path
	var sub string         // what joins path and those keys
	switch {
	case w.leaf(t):
	case t.Kind() == reflect.Struct:
		under, sub = t, "."
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		if e, x := w.elem(t.Elem(), expr); e != nil {
			under, expr, sub = e, x, "[]."
		}
	case t.Kind() == reflect.Map:
		if e, x := w.elem(t.Elem(), expr); e != nil {
			ph, ok := mapPlaceholders[path]
			if !ok {
				ph = "<name>"
			}
			under, expr, sub = e, x, "."+ph+"."
		}
	}
	w.keys = append(w.keys, Key{Path: path, Doc: doc, Leaf: under == nil})
	if under == nil {
		return nil
	}
	st, err := w.structOf(under, expr)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return w.fields(under, st, path+sub)
}

// elem returns a list's or map's element type when it is a struct with
// keys of its own (through a pointer too), and its expression in expr.
func (w *walker) elem(t reflect.Type, expr ast.Expr) (reflect.Type, ast.Expr) {
	switch x := expr.(type) {
	case *ast.ArrayType:
		expr = x.Elt
	case *ast.MapType:
		expr = x.Value
	default:
		expr = nil // a named list or map type: an unnamed element struct is not found
	}
	if t.Kind() == reflect.Pointer {
		t, expr = t.Elem(), unstar(expr)
	}
	if w.leaf(t) || t.Kind() != reflect.Struct {
		return nil, nil
	}
	return t, expr
}

// leaf says a value of type t surely has no keys of its own: a scalar, a
// list or map that decodes itself (yaml.Unmarshaler), or a struct from
// outside the module. A struct of the module that decodes itself still
// has its tagged fields as keys; other lists and maps are told by their
// elements (elem).
func (w *walker) leaf(t reflect.Type) bool {
	base := t
	for base.Kind() == reflect.Pointer {
		base = base.Elem()
	}
	switch base.Kind() {
	case reflect.Struct:
		return base.PkgPath() != w.module && !strings.HasPrefix(base.PkgPath(), w.module+"/")
	case reflect.Slice, reflect.Array, reflect.Map:
		return t.Implements(unmarshaler) || reflect.PointerTo(t).Implements(unmarshaler)
	}
	return true
}

// structOf returns the source of struct type t: its declaration when t
// is named, else expr, the struct type written in place.
func (w *walker) structOf(t reflect.Type, expr ast.Expr) (*ast.StructType, error) {
	if t.Name() == "" {
		if st, ok := expr.(*ast.StructType); ok {
			return st, nil
		}
		return nil, fmt.Errorf("unnamed %s has no struct type in its source", t)
	}
	decls, err := w.parse(t.PkgPath())
	if err != nil {
		return nil, err
	}
	st := decls[t.Name()]
	if st == nil {
		return nil, fmt.Errorf("%s.%s: no struct declaration found", t.PkgPath(), t.Name())
	}
	return st, nil
}

// parse returns the struct types declared in package pkg's non-test
// files, reading them the first time.
func (w *walker) parse(pkg string) (map[string]*ast.StructType, error) {
	if decls, ok := w.structs[pkg]; ok {
		return decls, nil
	}
	rel, ok := strings.CutPrefix(pkg, w.module)
	if !ok || rel != "" && rel[0] != '/' {
		return nil, fmt.Errorf("package %s is outside module %s", pkg, w.module)
	}
	dir := filepath.Join(w.root, filepath.FromSlash(strings.TrimPrefix(rel, "/")))
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	decls := map[string]*ast.StructType{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(w.fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				ts := s.(*ast.TypeSpec)
				if st, ok := ts.Type.(*ast.StructType); ok && ts.Assign == 0 && decls[ts.Name.Name] == nil {
					decls[ts.Name.Name] = st
				}
			}
		}
	}
	w.structs[pkg] = decls
	return decls, nil
}

// docText is a field's doc comment, else its line comment.
func docText(f *ast.Field) string {
	if f.Doc != nil {
		return f.Doc.Text()
	}
	if f.Comment != nil {
		return f.Comment.Text()
	}
	return ""
}

// embeddedName is the field name of an embedded field of type expr.
func embeddedName(expr ast.Expr) string {
	switch x := unstar(expr).(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.IndexExpr:
		return embeddedName(x.X)
	case *ast.IndexListExpr:
		return embeddedName(x.X)
	}
	return ""
}

// unstar is expr without a leading * (and parentheses).
func unstar(expr ast.Expr) ast.Expr {
	for {
		switch x := expr.(type) {
		case *ast.StarExpr:
			expr = x.X
		case *ast.ParenExpr:
			expr = x.X
		default:
			return expr
		}
	}
}

// hasOption says a yaml tag's options (after the name) hold o.
func hasOption(opts, o string) bool {
	for opt := range strings.SplitSeq(opts, ",") {
		if opt == o {
			return true
		}
	}
	return false
}
