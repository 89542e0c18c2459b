# torpor's node settings file (node-installer.yaml's TORPOR_NODE_ENV, on the host), read by the
# installer's pod and by node-agent.sh: `. node-env.sh; read_node_env FILE`.
#
# KEY=value lines, taken literally (no quotes, no $ or ` expanded: a value is the rest of its
# line), keys of capitals, digits and _; blank lines and # comments skipped. The file must be a
# plain file (no symbolic link: it would resolve inside the pod), owned by root and written by
# no one else, or nothing in it is used: it sets what root runs on the node.
read_node_env() {
    _file=$1
    [ -e "$_file" ] || return 0
    if [ -L "$_file" ] || [ ! -f "$_file" ]; then
        echo "torpor: $_file is not a plain file: not read" >&2
        return 1
    fi
    # shellcheck disable=SC2046
    set -- $(stat -c '%u %a' "$_file")
    if [ "$1" != 0 ] || [ $(( 0$2 & 022 )) -ne 0 ]; then
        echo "torpor: $_file must be root's and written by no one else (owner $1, mode $2): not read" >&2
        return 1
    fi
    while IFS= read -r _line || [ -n "$_line" ]; do
        case "$_line" in ""|"#"*) continue ;; esac
        _key=${_line%%=*}
        case "$_key" in
        "$_line"|""|[!A-Z_]*|*[!A-Z0-9_]*)
            echo "torpor: $_file: not KEY=value: $_line" >&2
            return 1 ;;
        esac
        export "$_key=${_line#*=}"
    done <"$_file"
}
