package config

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Secret reads the environment variable named by a *_env key. The value never goes into logs or errors.
func Secret(envVar string) string {
	s, _ := secret(envVar)
	return s
}

// FileSuffix names the companion of a secret's variable that holds a file to read it from instead:
// PAYGATE_REDIS_PASSWORD_FILE=/run/secrets/redis (Docker and Kubernetes secrets).
const FileSuffix = "_FILE"

// secret reads envVar, or when it is unset or empty the file named by envVar_FILE, without the file's
// trailing newline. Its errors name the variable and the file, never the secret.
func secret(envVar string) (string, error) {
	if envVar == "" {
		return "", nil
	}
	if v := os.Getenv(envVar); v != "" {
		return v, nil
	}
	path := os.Getenv(envVar + FileSuffix)
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("$%s%s: cannot read the secret file %s: %v", envVar, FileSuffix, path, errors.Unwrap(err))
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// secretKeys are keys people write when they put a secret in the file, each with the *_env key that names
// the secret's variable instead.
var secretKeys = map[string]string{"password": "password_env", "url": "url_env", "token": "auth_env",
	"secret": "auth_env", "api_key": "auth_env", "apikey": "auth_env", "auth": "auth_env", "authorization": "auth_env"}

// authSecretKeys are the same for a provider's auth: each key with the *_env key of its secret.
var authSecretKeys = map[string]string{"secret": "secret_env", "token": "secret_env", "api_key": "secret_env",
	"password": "secret_env", "client_secret": "client_secret_env", "client_id": "client_id_env"}

// secretHint is what the error about an unknown key in section adds when the key looks like a secret and
// the section has the *_env key for it: redis.password_env, broker.rabbitmq.url_env,
// broker.kafka.sasl.password_env or providers.<name>.auth_env.
func secretHint(section, key string) string {
	if name, ok := strings.CutPrefix(section, "providers."); ok && strings.Count(name, ".") == 1 && strings.HasSuffix(name, ".auth") {
		if env := authSecretKeys[key]; env != "" {
			return fmt.Sprintf("; secrets never live in the file: set %s.%s to the name of an environment variable holding it", section, env)
		}
		return ""
	}
	env := secretKeys[key]
	name, inProvider := strings.CutPrefix(section, "providers.")
	inProvider = inProvider && name != "" && !strings.ContainsAny(name, ".[") // the provider's own keys, not its limits'
	switch home := join(section, env); {
	case env == "":
	case home == "redis.password_env", home == "broker.rabbitmq.url_env", home == "broker.kafka.sasl.password_env",
		inProvider && env == "auth_env":
		return fmt.Sprintf("; secrets never live in the file: set %s to the name of an environment variable holding it", home)
	}
	return ""
}
