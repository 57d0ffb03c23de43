set terminal pngcairo size 1100,680 noenhanced font ',11'
set output 'max_seqlen_vs_gpus.png'
set title ARG1
set logscale x 2
set logscale y 10
set xrange [3.0769230769230766:41.6]
set xlabel 'GPUs'
set ylabel 'maximum sequence length (tokens)'
set format y '%.0s%c'
set key below box
set bmargin 14
set grid
plot 'max_seqlen_vs_gpus.dat' index 0 using 1:2:3 with filledcurves lt 1 fs transparent solid 0.15 noborder title 'band of model=Llama-3-8B: estimates at their high ends + calibrated reserve, to sourced terms alone', 'max_seqlen_vs_gpus.dat' index 1 using 1:2 with linespoints lt 1 lw 2 pt 7 title columnheader(1), 'max_seqlen_vs_gpus.dat' index 2 using 1:2:3 with labels offset 0,1 font ',8' tc lt 1 notitle, 'max_seqlen_vs_gpus.dat' index 3 using 1:2:2:3 with yerrorbars lt 1 pt 9 ps 2 title 'published (triangles; bars: [fits, fails) brackets)', 'max_seqlen_vs_gpus.dat' index 4 using 1:2:3 with filledcurves lt 2 fs transparent solid 0.15 noborder title 'band of model=GPT-13B', 'max_seqlen_vs_gpus.dat' index 5 using 1:2 with linespoints lt 2 lw 2 pt 7 title columnheader(1), 'max_seqlen_vs_gpus.dat' index 6 using 1:2:3 with labels offset 0,1 font ',8' tc lt 2 notitle, 'max_seqlen_vs_gpus.dat' index 7 using 1:2:2:3 with yerrorbars lt 2 pt 9 ps 2 notitle, 'max_seqlen_vs_gpus.dat' index 8 using 1:2:3 with filledcurves lt 3 fs transparent solid 0.15 noborder title 'band of model=GPT-30B', 'max_seqlen_vs_gpus.dat' index 9 using 1:2 with linespoints lt 3 lw 2 pt 7 title columnheader(1), 'max_seqlen_vs_gpus.dat' index 10 using 1:2:3 with labels offset 0,1 font ',8' tc lt 3 notitle, 'max_seqlen_vs_gpus.dat' index 11 using 1:2:2:3 with yerrorbars lt 3 pt 9 ps 2 notitle, 'max_seqlen_vs_gpus.dat' index 12 using 1:2:3 with filledcurves lt 4 fs transparent solid 0.15 noborder title 'band of model=Llama-3-70B', 'max_seqlen_vs_gpus.dat' index 13 using 1:2 with linespoints lt 4 lw 2 pt 7 title columnheader(1), 'max_seqlen_vs_gpus.dat' index 14 using 1:2:3 with labels offset 0,1 font ',8' tc lt 4 notitle, 'max_seqlen_vs_gpus.dat' index 15 using 1:2:2:3 with yerrorbars lt 4 pt 9 ps 2 notitle
set terminal svg size 1100,680 noenhanced font ',11'
set output 'max_seqlen_vs_gpus.svg'
replot
unset output
