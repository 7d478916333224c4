// Package envflag gives every flag of a FlagSet an environment variable of the
// same meaning: flag -queue-url reads QUEUE_URL. A flag given on the command
// line wins over the environment.
package envflag

import (
	"flag"
	"fmt"
	"strings"
)

// Name is the environment variable for a flag: upper case, '-' and '.' as '_'.
func Name(flag string) string {
	return strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(flag))
}

// Parse parses args, then sets each flag not given in args from getenv.
// The FlagSet's usage lists the variable beside each flag.
func Parse(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	fs.Usage = func() { usage(fs) }
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		if v := getenv(Name(f.Name)); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q (flag -%s): %w", Name(f.Name), v, f.Name, e)
			}
		}
	})
	return err
}

func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprintf(w, "Usage of %s (every flag can also be set by the environment variable shown):\n", fs.Name())
	fs.VisitAll(func(f *flag.Flag) {
		name, text := flag.UnquoteUsage(f)
		line := "  -" + f.Name
		if name != "" {
			line += " " + name
		}
		line += "  [$" + Name(f.Name) + "]\n    \t" + strings.ReplaceAll(text, "\n", "\n    \t")
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "0s" {
			line += fmt.Sprintf(" (default %q)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	})
}
