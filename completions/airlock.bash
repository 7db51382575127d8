# bash completion for airlock (installed as bash-completion/completions/airlock).
# Commands and options come from the binary's own help (relay/cli/help.c), so
# they stay in step with it.
_airlock() {
	local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]:-} i
	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W "$(airlock help 2>/dev/null | sed -n 's/^  \([a-z][a-z-]*\).*/\1/p' | sort -u) --help --version" -- "$cur"))
		return
	fi
	# after exec's or shell's "--": the guest command, then its files
	for ((i = 2; i < COMP_CWORD; i++)); do
		if [ "${COMP_WORDS[i]}" = -- ]; then
			if [ $((i + 1)) -eq "$COMP_CWORD" ]; then
				COMPREPLY=($(compgen -c -- "$cur"))
			else
				COMPREPLY=($(compgen -f -- "$cur"))
			fi
			return
		fi
	done
	case $cur in
	-*) COMPREPLY=($(compgen -W "$(airlock "$cmd" --help 2>/dev/null | grep -oE -- '(^|[ ,])--?[a-zA-Z][a-z-]*' | tr -d ' ,' | sort -u)" -- "$cur")) ;;
	*)
		case $cmd in
		policy) [ "$COMP_CWORD" -eq 2 ] && COMPREPLY=($(compgen -W "check explain" -- "$cur")) || COMPREPLY=($(compgen -f -- "$cur")) ;;
		help) COMPREPLY=($(compgen -W "$(airlock help 2>/dev/null | sed -n 's/^  \([a-z][a-z-]*\).*/\1/p' | sort -u)" -- "$cur")) ;;
		*) COMPREPLY=($(compgen -d -- "$cur")) ;;
		esac
		;;
	esac
}
complete -o filenames -F _airlock airlock
