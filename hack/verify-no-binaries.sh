#!/usr/bin/env bash
# Fails when a file git tracks is a compiled executable or object (ELF,
# Mach-O, PE): binaries are built into bin/, never committed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
git ls-files -z | perl -0 -ne '
	chomp;
	next if -l $_ || !-f $_;
	open(my $fh, "<:raw", $_) or next;
	read($fh, my $m, 4);
	close $fh;
	if ($m =~ /^\x7fELF/ || $m =~ /^(\xcf\xfa\xed\xfe|\xce\xfa\xed\xfe|\xfe\xed\xfa\xce|\xfe\xed\xfa\xcf|\xca\xfe\xba\xbe)/ || $m =~ /^MZ/) {
		print "  $_\n"; $bad = 1;
	}
	END {
		if ($bad) { print STDERR "compiled binaries are tracked by git (remove them; build them into bin/)\n"; exit 1 }
	}'
