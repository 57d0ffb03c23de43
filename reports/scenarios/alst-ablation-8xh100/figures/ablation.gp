set terminal pngcairo size 1100,680 noenhanced font ',11'
set output 'ablation.png'
set title ARG1
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set logscale y 10
set format y '%.0s%c'
set ylabel 'maximum sequence length (tokens)'
set xlabel 'sweep point'
set xtics rotate by -25
set grid ytics
set key below
set bmargin 8
plot 'ablation.dat' using 2:xtic(1) title 'predicted (longseq)', '' using 3 title 'published (source in report.md)'
set terminal svg size 1100,680 noenhanced font ',11'
set output 'ablation.svg'
replot
unset output
