# codebox's session driver for Bash: one shell whose variables, environment, working
# directory, functions, aliases and options last across the cells of a session. The protocol
# (docs/sandbox-init.md, "The driver protocol"):
#
#   fd 3  <- cell <execution number> <code length>\n<code>
#   fd 4  -> ready\n                                   (once, at start)
#            syntax <length>\n<message>                (`bash -n` refuses the cell; nothing ran)
#            compiled\n done ok|error <status>|interrupted\n        (never a result)
#
# A cell is `eval`ed at the top level of the driver's own shell (not in a function: `declare`
# makes globals, `return` and `break` are refused as in a script), with fd 0 on
# $CODEBOX_CELL_STDIN; its status is the status of its last command.
#
# SIGINT: a non-interactive shell cannot stop what it runs on SIGINT (a trap runs after the
# command, and the script goes on); an interactive one can: it abandons what it runs and reads
# its next command line, as in a terminal. So the shell that runs the cells is `bash -i`,
# reading command lines from a FIFO on its fd 0, and each cell runs from $PROMPT_COMMAND,
# which the shell runs before it reads a line (and runs as a non-interactive shell would: no
# job numbers, no terminal complaints). Before the cell runs, the driver writes an empty line
# into the FIFO: SIGINT abandons the cell, the shell reads that line, and the next
# $PROMPT_COMMAND answers `done interrupted` for it. A shell acts on SIGINT only once the
# command it waits on has ended, and only if that command died of it, so a `sleep` the cell
# waits on must get SIGINT too (a terminal's Ctrl-C goes to the whole process group); a
# command codebox-init kills first lets the cell go on to its next command until SIGINT comes.
# Between cells SIGINT is ignored, from the first command of $PROMPT_COMMAND on: an
# interrupt that is not answered is sent again (codebox-init repeats it every 250 ms, since
# bash, hit while it forks the next command of a loop, goes on about one time in ten), and a
# repeat must not abandon the $PROMPT_COMMAND that answers the first.
#
# As in a terminal, `exit` (and a failing command under `set -e`) ends the shell and so the
# driver: codebox-init reports driver_exited and starts a new one; bash writes "exit" on
# stderr then. The code is read byte for byte (LC_ALL=C): a cell may hold any byte but NUL,
# which no shell variable can (such a cell is answered `syntax`); the read is a byte per
# system call, so a cell of 1 MB takes a second or two to arrive (100 KB: 0.2 s).

if [ "$1" != --setup ]; then
  # Started by codebox-init: make the FIFO and become the interactive shell that reads it.
  fifo=$(mktemp -u /tmp/codebox-bash-driver.XXXXXXXX) && mkfifo -m 600 "$fifo" || exit 70
  exec 5<>"$fifo"
  rm -f "$fifo"
  printf '%s\n' ". '${BASH_SOURCE[0]}' --setup" >&5 # the first command line
  # Job control off (+m); its start-up complaints and the first prompt go to /dev/null, the
  # real stderr waits on fd 9 until --setup takes it back.
  exec "$BASH" --norc --noprofile --noediting +m -i 0<&5 5<&- 9>&2 2>/dev/null
fi

# --setup: sourced by the interactive shell, as its first command line.
exec 2>&9 9>&-
PS1='' PS2='' PS0=''
unset HISTFILE
set +o history +H
exec {__codebox_requests}<&3 {__codebox_replies}>&4 3<&- 4<&- # fds 3 and 4 are the cells'
__codebox_bash=$BASH
__codebox_busy=     # set while a cell runs
__codebox_code=
exec {__codebox_stderr}>&2 # for a fatal error, wherever a cell sends fd 2
# What runs one cell, at the top level (`eval` in a function would make `declare` local).
# Backslashes: never an alias; 2>/dev/null: under a cell's `set -x`, the driver's own
# commands are not traced.
PROMPT_COMMAND='{ builtin trap -- "" INT; \__codebox_next; } 2>/dev/null && { builtin eval -- "$__codebox_code"; } <"${CODEBOX_CELL_STDIN:-/dev/null}"; { \__codebox_done $?; } 2>/dev/null'

__codebox_reply() {
  builtin printf '%s' "$1" >&"$__codebox_replies"
}

__codebox_fail() {
  builtin printf 'codebox bash driver: %s\n' "$1" >&"$__codebox_stderr"
  exec 2>/dev/null
  exit 70
}

# Answers a cell that SIGINT abandoned, reads the next request, checks it with `bash -n` and
# answers `syntax` (returns 1) or `compiled` (returns 0: the cell runs).
__codebox_next() {
  local - # the cells' `set` options (-e, -u, -x, pipefail) are not this function's
  set +euxo pipefail
  builtin trap '' INT
  builtin printf '\n' >&0 # a command line to read after this cell, whatever happens to it
  if [[ -n $__codebox_busy ]]; then
    __codebox_busy=
    __codebox_reply $'done interrupted\n'
  fi
  local LC_ALL=C header length chunk message
  if ! IFS= builtin read -r header <&"$__codebox_requests"; then
    exec 2>/dev/null # codebox-init closed fd 3: the session is over
    exit 0
  fi
  [[ $header =~ ^cell\ ([0-9]+)\ ([0-9]+)$ ]] || __codebox_fail "a request that is not \`cell <n> <length>\`: $header"
  length=${BASH_REMATCH[2]}
  __codebox_code=
  message=
  # Exactly <length> bytes: read stops at a NUL byte (consumed, not stored) or at the count.
  while ((length > 0)); do
    IFS= builtin read -r -d '' -n "$length" chunk <&"$__codebox_requests" ||
      [[ ${#chunk} -eq $length ]] || __codebox_fail "the requests ended inside a cell"
    __codebox_code+=$chunk
    if ((${#chunk} < length)); then
      message=$'bash: the cell holds a NUL byte, which no shell can run\n'
      ((length--))
    fi
    ((length -= ${#chunk}))
  done
  if [[ -z $message ]]; then # extglob: as languages.toml's check of a script
    if message=$(exec -a bash "$__codebox_bash" -O extglob -n 2>&1 <<<"$__codebox_code"); then
      message=
    else
      message="${message:-bash: syntax error}"$'\n'
    fi
  fi
  if [[ -n $message ]]; then
    __codebox_code=
    __codebox_reply "syntax ${#message}"$'\n'"$message"
    return 1
  fi
  __codebox_busy=1
  __codebox_reply $'compiled\n'
  builtin trap - INT
}

__codebox_done() {
  local status=$1
  local -
  set +euxo pipefail
  builtin trap '' INT
  [[ -n $__codebox_busy ]] || return 0 # the cell did not run (a `syntax` answer)
  __codebox_busy=
  # codebox-init ends what the cell left running; forgotten here, the shell does not report
  # them ("[1]+ Killed ...") before the next cell.
  builtin disown -a
  if ((status == 0)); then
    __codebox_reply $'done ok\n'
  else
    __codebox_reply "done error $status"$'\n'
  fi
}

builtin trap '' INT
__codebox_reply $'ready\n'
# The first cell: the prompt after this command line runs $PROMPT_COMMAND.
