package pushlbcaddy

// RuleOf returns the rule of service's balancer in u's client, or "" when
// it has none.
func RuleOf(u *Upstreams, service string) string {
	b, err := u.client.Balancer(service)
	if err != nil {
		return ""
	}
	return b.Config().Rule
}
