set terminal pngcairo size 1100,680 noenhanced font ',11'
set output 'host_memory.png'
set title ARG1
set style data histograms
set style fill solid 0.85 border -1
set boxwidth 0.75
set ylabel 'GiB of host memory per node'
set xlabel 'sweep point'
set yrange [0:*]
set xtics rotate by -45 font ',9'
set key below
set bmargin 7
set grid ytics
plot 'host_memory.dat' using 2:xtic(1) title 'predicted per node', '' using 0:3 with linespoints lw 2 pt 7 title 'usable per node'
set terminal svg size 1100,680 noenhanced font ',11'
set output 'host_memory.svg'
replot
unset output
