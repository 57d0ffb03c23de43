set terminal pngcairo size 1100,680 noenhanced font ',11'
set output 'max_seqlen_vs_gpus.png'
set title ARG1
set logscale x 2
set logscale y 10
set xrange [6.153846153846153:1331.2]
set xlabel 'GPUs'
set ylabel 'maximum sequence length (tokens)'
set format y '%.0s%c'
set key below box
set bmargin 9
set grid
plot 'max_seqlen_vs_gpus.dat' index 0 using 1:2:3 with filledcurves lt 1 fs transparent solid 0.15 noborder title 'band of step=Ulysses alone: estimates at their high ends + calibrated reserve, to sourced terms alone', 'max_seqlen_vs_gpus.dat' index 1 using 1:2 with linespoints lt 1 lw 2 pt 7 title columnheader(1), 'max_seqlen_vs_gpus.dat' index 2 using 1:2:3 with labels offset 0,1 font ',8' tc lt 1 notitle, 'max_seqlen_vs_gpus.dat' index 3 using 1:2:3 with filledcurves lt 2 fs transparent solid 0.15 noborder title 'band of step=Ulysses x ring', 'max_seqlen_vs_gpus.dat' index 4 using 1:2 with linespoints lt 2 lw 2 pt 7 title columnheader(1), 'max_seqlen_vs_gpus.dat' index 5 using 1:2:3 with labels offset 0,1 font ',8' tc lt 2 notitle
set terminal svg size 1100,680 noenhanced font ',11'
set output 'max_seqlen_vs_gpus.svg'
replot
unset output
