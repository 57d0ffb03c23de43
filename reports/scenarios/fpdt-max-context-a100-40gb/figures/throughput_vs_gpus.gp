set terminal pngcairo size 1100,680 noenhanced font ',11'
set output 'throughput_vs_gpus.png'
set title ARG1
set logscale x 2
set logscale y 10
set xrange [0.7692307692307692:10.4]
set xlabel 'GPUs'
set ylabel 'tokens/s (cluster)'
set format y '%.0s%c'
set key below box
set bmargin 8
set grid
plot 'throughput_vs_gpus.dat' index 0 using 1:2 with linespoints lt 1 lw 2 pt 7 title columnheader(1), 'throughput_vs_gpus.dat' index 1 using 1:2 with linespoints lt 2 lw 2 pt 7 title columnheader(1), 'throughput_vs_gpus.dat' index 2 using 1:2 with linespoints lt 3 lw 2 pt 7 title columnheader(1)
set terminal svg size 1100,680 noenhanced font ',11'
set output 'throughput_vs_gpus.svg'
replot
unset output
