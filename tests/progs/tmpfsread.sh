#!/bin/bash
# tmpfsread.sh: reads DIR/f ("hi") every step for 5 seconds, with bash builtins only; prints
# FAIL when it is not there or holds something else, then RESULT <hex> and PASS. Run inside
# namespaces a test makes (a tmpfs at DIR that only they see).
#
# Usage: tmpfsread.sh DIR
D=$1
echo START
exec {tick}<> <(:)
h=0
for (( s = 0; s < 500; s++ )); do
  read -r x < "$D/f" || x=missing
  [ "$x" = hi ] || echo "FAIL step $s: $D/f holds $x"
  h=$(( (h * 31 + s) & 0xffffffff ))
  read -t 0.01 -u $tick
done
printf 'RESULT %016x\nPASS\n' $h
