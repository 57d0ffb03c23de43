set terminal pngcairo size 1100,680 noenhanced font ',11'
set output 'throughput_vs_card.png'
set title ARG1
set xrange [-0.6:2.6]
set xlabel 'GPU'
set logscale y 10
set yrange [177.97804709900603:4862.823829204258]
set ytics (200, 500, 1000, 2000)
set ylabel 'tokens/s (cluster)'
set format y '%.0s%c'
set key below box
set bmargin 8
set grid ytics
plot 'throughput_vs_card.dat' index 0 using 1:2 with points lt 1 pt 7 ps 1.5 title columnheader(1), '' index 0 using 1:2:3 with labels offset 0,1 font ',8' tc lt 1 notitle, 'throughput_vs_card.dat' index 1 using 1:2 with points lt 2 pt 7 ps 1.5 title columnheader(1), '' index 1 using 1:2:3 with labels offset 0,1 font ',8' tc lt 2 notitle, 'throughput_vs_card.dat' index 2 using 1:2 with points lt 3 pt 7 ps 1.5 title columnheader(1), '' index 2 using 1:2:3 with labels offset 0,1 font ',8' tc lt 3 notitle, 'throughput_vs_card.dat' index 3 using 1:(355.95609419801207):xtic(2) with points ps 0 notitle
set terminal svg size 1100,680 noenhanced font ',11'
set output 'throughput_vs_card.svg'
replot
unset output
