// Package pushlbcaddy makes pushlb a Caddy module.
package pushlbcaddy
