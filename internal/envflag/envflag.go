// Package envflag gives every flag of a FlagSet an environment variable of the
// same meaning: flag -max-batch reads VRAMQ_MAX_BATCH. The queue and bucket
// flags shared by every vramq binary read the plain names of the project's
// contract (flag -queue-url reads QUEUE_URL). A flag given on the command
// line wins over the environment.
package envflag

import (
	"flag"
	"fmt"
	"strings"
)

// contract lists the flags whose variables are named without a prefix, as
// the deployment (ECS task definitions, Lambda, Terraform outputs) sets them.
var contract = map[string]bool{"queue-url": true, "results-queue-url": true, "dlq-url": true, "payload-bucket": true}

// Name is the environment variable for a flag: upper case, '-' and '.' as
// '_', behind VRAMQ_ unless the flag is one of the contract's. The prefix
// keeps generic names (COUNT, DEVICE, TIMEOUT) from being picked up by
// accident from an unrelated environment.
func Name(flag string) string {
	n := strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(flag))
	if contract[flag] {
		return n
	}
	return "VRAMQ_" + n
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
		switch f.DefValue {
		case "", "0", "0B", "0s", "false":
		default:
			line += fmt.Sprintf(" (default %q)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	})
}

// List splits a comma-separated flag value into its items, each trimmed,
// with the empty ones left out: "a, b,," is [a b]. The flags that take a
// list (names, models, keys, CIDR blocks) read it the same way.
func List(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
