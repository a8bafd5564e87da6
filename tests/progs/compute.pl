#!/usr/bin/perl
# compute.pl: a deterministic Perl computation in steps, for checkpoint/restart tests.
#
# Checks that a running perl interpreter (its heap, a hash, an array, a Digest::MD5 object)
# survives checkpoint/restart: each step extends an MD5 hash chain, stores it in a hash and
# pushes a running Collatz count, then sleeps 10 ms (select, restarted if interrupted).
# Prints START, then RESULT <hex> (equal to an uninterrupted run's) and PASS if the hash and the
# array agree with what the loop recorded.
#
# Usage: compute.pl [SECONDS=5]
use strict;
use warnings;
use Digest::MD5;
use Time::HiRes qw(time);

$| = 1;
print "START\n";
my $secs  = @ARGV ? $ARGV[0] : 5;
my $steps = int($secs / 0.01) || 1;

my $chain = Digest::MD5->new->add("ckpt")->hexdigest;
my %seen;
my @collatz;
for my $s (0 .. $steps - 1) {
    for (1 .. 50) {
        $chain = Digest::MD5->new->add($chain, $s)->hexdigest;
    }
    $seen{ $s % 997 } = $chain;
    my ($n, $len) = ($s + 27, 0);
    while ($n != 1) { $n = $n % 2 ? 3 * $n + 1 : $n / 2; $len++ }
    push @collatz, $len;
    # sleep 10 ms; if a signal cuts it short, sleep what is left (at most one step)
    my $until = time + 0.01;
    while ((my $left = $until - time) > 0) {
        last if $left > 0.01;
        select(undef, undef, undef, $left);
    }
}
my $ok = keys(%seen) == ($steps < 997 ? $steps : 997) && @collatz == $steps;
my $all = join(",", $chain, map({ "$_=$seen{$_}" } sort { $a <=> $b } keys %seen), @collatz);
print "RESULT ", substr(Digest::MD5::md5_hex($all), 0, 16), "\n";
print $ok ? "PASS\n" : "FAIL hash or array inconsistent\n";
exit($ok ? 0 : 1);
