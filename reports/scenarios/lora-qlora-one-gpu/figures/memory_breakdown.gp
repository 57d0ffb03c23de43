set terminal pngcairo size 1100,680 noenhanced font ',11'
set output 'memory_breakdown.png'
set title ARG1
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.75
set ylabel 'GiB per GPU at the peak'
set xlabel 'sweep point (its axis values, then the length)'
set xtics rotate by -45 font ',9'
set key outside right
set grid ytics
plot 'memory_breakdown.dat' using 2:xtic(1) title 'model states', 'memory_breakdown.dat' using 3 title 'ZeRO buffers', 'memory_breakdown.dat' using 4 title 'checkpoints', 'memory_breakdown.dat' using 5 title 'layer working set', 'memory_breakdown.dat' using 6 title 'logits and loss', 'memory_breakdown.dat' using 7 title 'inputs', 'memory_breakdown.dat' using 8 title 'runtime', 'memory_breakdown.dat' using 9 title 'calibrated overhead'
set terminal svg size 1100,680 noenhanced font ',11'
set output 'memory_breakdown.svg'
replot
unset output
