package rabbitmq

import (
	"errors"
	"fmt"
	"net/url"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Refusal is an answer the broker gives again until the configuration changes: its credentials refused
// (403 ACCESS_REFUSED), its vhost unknown or forbidden (530 NOT_ALLOWED), or a URL that is not AMQP. At
// start it ends Open at once; once connected, a refusal (credentials being rotated) is retried like any
// other failure, and Ready names it.
type Refusal struct{ What string }

func (r *Refusal) Error() string { return r.What }

// refusal returns err as a *Refusal when it is one, naming the user and the vhost but never the password;
// any other error comes back as it is.
func refusal(raw string, err error) error {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return err
	}
	user, vhost := "", "/"
	if u, perr := url.Parse(raw); perr == nil {
		user = u.User.Username()
		if len(u.Path) > 1 {
			vhost = u.Path[1:]
		}
	}
	switch ae.Code {
	case amqp.AccessRefused:
		return &Refusal{fmt.Sprintf("ACCESS_REFUSED for user %q: %s", user, ae.Reason)}
	case amqp.NotAllowed:
		return &Refusal{fmt.Sprintf("NOT_ALLOWED for user %q on vhost %q: %s", user, vhost, ae.Reason)}
	}
	return err
}

// checkURL refuses a URL amqp091-go cannot dial, without echoing it (it holds a password).
func checkURL(raw string) error {
	if _, err := amqp.ParseURI(raw); err != nil {
		scheme := "none"
		if u, perr := url.Parse(raw); perr == nil && u.Scheme != "" {
			scheme = u.Scheme + "://"
		}
		// A *url.Error quotes the whole URL, password and all: only what it says of it goes out.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return &Refusal{fmt.Sprintf("not an AMQP URL (amqp://user:pass@host:5672/vhost or amqps://…), scheme %s: %v", scheme, err)}
	}
	return nil
}
