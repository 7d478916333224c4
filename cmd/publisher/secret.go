package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
)

// secretGetter is the one Secrets Manager call the publisher makes.
type secretGetter interface {
	GetSecretValue(context.Context, *secretsmanager.GetSecretValueInput, ...func(*secretsmanager.Options)) (
		*secretsmanager.GetSecretValueOutput, error)
}

// apiKeysFromSecret reads bearer keys from a Secrets Manager secret, once, at
// start: for a Lambda function that is its cold start, and keys never sit in
// plain text in the function's configuration, a task definition or the
// Terraform state (ECS can inject a secret into a container's environment;
// Lambda cannot, so the function reads it itself). The secret's string holds
// the keys separated by commas or new lines; # starts a comment line. A secret
// that names no key is refused, as -api-keys="," is: whoever set it meant auth
// to be on. Errors name the secret as configured, never its content.
func apiKeysFromSecret(ctx context.Context, sm secretGetter, id string) ([]string, error) {
	out, err := sm.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(id)})
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flagName("api-keys-secret"), id, err)
	}
	if out.SecretString == nil {
		return nil, fmt.Errorf("%s %s: a binary secret; want the keys as text, comma- or line-separated", flagName("api-keys-secret"), id)
	}
	var keys []string
	for _, line := range strings.Split(*out.SecretString, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, k := range strings.Split(line, ",") {
			if k = strings.TrimSpace(k); k != "" {
				keys = append(keys, k)
			}
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s %s names no key: refusing to start without auth by mistake", flagName("api-keys-secret"), id)
	}
	return keys, nil
}
